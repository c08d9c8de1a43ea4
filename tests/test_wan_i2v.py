"""Wan I2V conditioning built for training equals what WanImageToVideoPipeline builds at sampling, and
feeds a 36-channel-style tiny I2V transformer; TI2V keeps the first latent frame clean at timestep 0."""
from __future__ import annotations

import torch

from trainer_backend.families.wan.i2v import first_frame_condition, i2v_input, ti2v_mix
from trainer_backend.families.wan.tiny import Z_DIM, tiny_components


def test_first_frame_condition_matches_the_i2v_pipeline():
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    parts = tiny_components(seed=0, experts=1)
    vae = parts["vae"]
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                        in_channels=2 * Z_DIM + 4, out_channels=Z_DIM, text_dim=32, freq_dim=32,
                                        ffn_dim=32, num_layers=1, rope_max_seq_len=32)
    pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=parts["text_encoder"], vae=vae,
                                   scheduler=parts["scheduler"], transformer=transformer)
    image = torch.rand(1, 3, 32, 32) * 2 - 1
    noise, expected = pipe.prepare_latents(image, 1, Z_DIM, 32, 32, 9, torch.float32, torch.device("cpu"),
                                           torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = first_frame_condition(vae, image, num_frames=9)
    assert got.shape == expected.shape == (1, 4 + Z_DIM, 3, 4, 4)
    assert torch.allclose(got, expected, atol=1e-5)
    x = i2v_input(noise, got)
    assert x.shape[1] == transformer.config.in_channels
    with torch.no_grad():
        out = transformer(hidden_states=x, timestep=torch.tensor([500.0]),
                          encoder_hidden_states=torch.randn(1, 4, 32), return_dict=False)[0]
    assert out.shape == noise.shape


def test_ti2v_first_frame_stays_clean_at_timestep_zero():
    noisy, clean = torch.randn(2, 4, 3, 4, 4), torch.randn(2, 4, 3, 4, 4)
    latents, per_token = ti2v_mix(noisy, clean, torch.tensor([700.0, 300.0]))
    assert torch.equal(latents[:, :, 0], clean[:, :, 0]) and torch.equal(latents[:, :, 1:], noisy[:, :, 1:])
    assert per_token.shape == (2, 3 * 2 * 2)
    assert (per_token[:, :4] == 0).all() and (per_token[0, 4:] == 700).all() and (per_token[1, 4:] == 300).all()
