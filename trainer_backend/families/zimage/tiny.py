"""A tiny random Z-Image pipeline, built offline in seconds for tests and the demo: a two-layer
Qwen3 text model with the offline Qwen tokenizer (families/tiny_qwen.py), the 16-channel KL VAE
with the scale and shift of the Flux.1 autoencoder Z-Image uses, a ZImageTransformer2DModel with
one noise-refiner and one context-refiner block and two main layers, and Z-Image-Turbo's
flow-matching scheduler (shift 3). The VAE downsamples by 2: 32 px is a 16×16 latent, 64 tokens."""
from __future__ import annotations

import shutil
from pathlib import Path

QWEN_MAX_LENGTH = 64  # the tiny tokenizer's limit (the real Qwen3's is far above Z-Image's 512)
TEXT_WIDTH = 32


def scheduler_config() -> dict:
    """FlowMatchEulerDiscreteScheduler as Z-Image-Turbo ships it (a fixed shift of 3)."""
    return dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)


def tiny_transformer_config() -> dict:
    return dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2, n_refiner_layers=1,
                n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=TEXT_WIDTH, rope_theta=256.0,
                t_scale=1000.0, axes_dims=[4, 6, 6], axes_lens=[1024, 128, 128])


def build_tiny_zimage(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen2Tokenizer, Qwen3Model
    from ..flow_common import tiny_vae_16ch
    from ..tiny_qwen import build_qwen_tokenizer, tiny_qwen3_config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Qwen2Tokenizer.from_pretrained(str(build_qwen_tokenizer(out / "tokenizer", QWEN_MAX_LENGTH)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = ZImageTransformer2DModel(**tiny_transformer_config())
        # x_pad_token / cap_pad_token start at zero in diffusers; random values make a wrong mask visible
        with torch.no_grad():
            transformer.x_pad_token.normal_()
            transformer.cap_pad_token.normal_()
        torch.manual_seed(seed + 1)
        vae = tiny_vae_16ch(0.3611, 0.1159)
        torch.manual_seed(seed + 2)
        text_encoder = Qwen3Model(tiny_qwen3_config(hidden_size=TEXT_WIDTH, num_hidden_layers=2))
    pipe = ZImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config()), vae=vae,
                          text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)
    pipe.save_pretrained(out, safe_serialization=True)
    shutil.rmtree(out / "tokenizer")  # the plain Qwen layout (vocab.json, merges.txt, tokenizer.json)
    build_qwen_tokenizer(out / "tokenizer", QWEN_MAX_LENGTH)
    return out
