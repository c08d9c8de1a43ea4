"""Tiny random SD1 / SD2 / SDXL pipelines, built offline in seconds, for tests and demos.

They have the real architectures' shape (cross-attention UNet, KL VAE, CLIP text encoders,
the right scheduler and prediction type, SDXL's two encoders and time ids) at a size that
trains on a CPU: a few MB on disk. Weights are random but deterministic for a seed.
The VAE has two blocks, so it downsamples by 2: a 32 px image is a 16x16 latent.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ...errors import ConfigError
from .tiny_tokenizer import EOS, MODEL_MAX_LENGTH, vocab_size, write_tokenizer

ARCHES = ("sd1", "sd2", "sdxl")

SDXL_TIME_EMBED_DIM = 8
SDXL_TE2_PROJECTION_DIM = 32


def _text_encoder_config(width: int, pad_token_id: int, open_clip: bool, projection_dim: int = 32) -> dict:
    """CLIP text config; OpenCLIP encoders (SD2, SDXL's second) use gelu, OpenAI CLIP quick_gelu."""
    n = vocab_size()
    return dict(vocab_size=n, hidden_size=width, intermediate_size=width * 4, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=MODEL_MAX_LENGTH, projection_dim=projection_dim,
                hidden_act="gelu" if open_clip else "quick_gelu", layer_norm_eps=1e-5,
                bos_token_id=n - 2, eos_token_id=n - 1, pad_token_id=pad_token_id)


def _unet_config(arch: str) -> dict:
    """UNet2DConditionModel kwargs: two levels (32, 64 channels), attention on the second."""
    common = dict(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                  block_out_channels=(32, 64), norm_num_groups=32,
                  down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"))
    if arch == "sd1":
        return {**common, "cross_attention_dim": 32, "attention_head_dim": 8}
    if arch == "sd2":
        # SD2: linear projections in the transformer blocks, per-block head counts, upcast attention.
        return {**common, "cross_attention_dim": 32, "attention_head_dim": (2, 4),
                "use_linear_projection": True, "upcast_attention": True}
    return {**common, "cross_attention_dim": 32 + 64, "attention_head_dim": (2, 4),
            "use_linear_projection": True, "addition_embed_type": "text_time",
            "addition_time_embed_dim": SDXL_TIME_EMBED_DIM,
            # six time ids (original size, crop top-left, target size) + the pooled text embedding
            "projection_class_embeddings_input_dim": 6 * SDXL_TIME_EMBED_DIM + SDXL_TE2_PROJECTION_DIM,
            "transformer_layers_per_block": (1, 2)}


def _vae_config(arch: str, downsample: int = 2) -> dict:
    """downsample 2 (the default: tests run at 32 px) or 4/8 (SD's own factor is 8)."""
    blocks = {2: 2, 4: 3, 8: 4}[downsample]
    return dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
                block_out_channels=(16, 32, 32, 32)[:blocks], norm_num_groups=8, sample_size=32,
                down_block_types=("DownEncoderBlock2D",) * blocks, up_block_types=("UpDecoderBlock2D",) * blocks,
                scaling_factor=0.13025 if arch == "sdxl" else 0.18215, force_upcast=arch == "sdxl")


def _scheduler(arch: str):
    """The scheduler each real family ships with (SD1: PNDM, SD2-768: DDIM v-pred, SDXL: Euler)."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler, PNDMScheduler
    common = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                  steps_offset=1)
    if arch == "sd1":
        return PNDMScheduler(**common, skip_prk_steps=True, set_alpha_to_one=False)
    if arch == "sd2":
        return DDIMScheduler(**common, prediction_type="v_prediction", clip_sample=False, set_alpha_to_one=False)
    return EulerDiscreteScheduler(**common, prediction_type="epsilon", timestep_spacing="leading",
                                  interpolation_type="linear")


def build_tiny_model(arch: str, out_dir: str | Path, seed: int = 0, vae_downsample: int = 2) -> Path:
    """Build a tiny random `arch` pipeline and save it as a diffusers folder at `out_dir`.
    `vae_downsample` 8 gives SD's latent size (benchmarks that need real proportions)."""
    if arch not in ARCHES:
        raise ConfigError(f"model.arch: tiny models exist for {', '.join(ARCHES)}, got {arch!r}")
    if vae_downsample not in (2, 4, 8):
        raise ValueError(f"vae_downsample must be 2, 4 or 8, got {vae_downsample}")
    import torch
    from diffusers import (AutoencoderKL, StableDiffusionPipeline, StableDiffusionXLPipeline,
                           UNet2DConditionModel)
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-tok-"))
    try:
        # The tokenizer folders are written by hand (offline); SD2/SDXL-2 pad with "!" like the real ones.
        pad_1 = "!" if arch == "sd2" else EOS
        tokenizer = CLIPTokenizer.from_pretrained(write_tokenizer(staging / "tokenizer", pad_token=pad_1))
        tokenizer_2 = (CLIPTokenizer.from_pretrained(write_tokenizer(staging / "tokenizer_2", pad_token="!"))
                       if arch == "sdxl" else None)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unet = UNet2DConditionModel(**_unet_config(arch))
        torch.manual_seed(seed + 1)
        vae = AutoencoderKL(**_vae_config(arch, vae_downsample))
        torch.manual_seed(seed + 2)
        text_encoder = CLIPTextModel(CLIPTextConfig(**_text_encoder_config(32, tokenizer.pad_token_id,
                                                                                 open_clip=arch == "sd2")))
        if arch == "sdxl":
            torch.manual_seed(seed + 3)
            te2_config = CLIPTextConfig(**_text_encoder_config(64, tokenizer_2.pad_token_id, open_clip=True,
                                                                projection_dim=SDXL_TE2_PROJECTION_DIM))
            text_encoder_2 = CLIPTextModelWithProjection(te2_config)

    if arch == "sdxl":
        pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
                                         tokenizer=tokenizer, tokenizer_2=tokenizer_2, unet=unet,
                                         scheduler=_scheduler(arch))
    else:
        pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                       scheduler=_scheduler(arch), safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)
    pipe.save_pretrained(out, safe_serialization=True)
    # Replace whatever the tokenizer's save wrote with the plain vocab/merges layout (loads everywhere).
    for sub, pad in (("tokenizer", pad_1), ("tokenizer_2", "!")):
        if (out / sub).is_dir():
            shutil.rmtree(out / sub)
            write_tokenizer(out / sub, pad_token=pad)
    return out


def make_tiny_model(arch: str, out: str | Path) -> Path:
    """CLI entry (`make-tiny-model --arch ARCH --out DIR`): build with seed 0, return the folder."""
    return build_tiny_model(arch, out, seed=0)
