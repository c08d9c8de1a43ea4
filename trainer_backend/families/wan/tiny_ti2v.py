"""A tiny random Wan 2.2 TI2V pipeline (WanPipeline with expand_timesteps, as TI2V-5B) for tests: tiny.py's
two-layer UMT5 and tokenizer, ONE two-block transformer (no second expert) over the latents alone
(in = out = the VAE's latent channels), and a tiny Wan 2.2-style AutoencoderKLWan: pixels patchified 2x2 into
12 channels, residual blocks, its own per-channel latents_mean/std (not 0/1, so the normalisation is exercised),
4x temporal compression. It compresses 8x spatially (the patchify and two downsamplings; the real one's 16x
is three), so the 32 px clips of the tests still give each latent frame 2x2 tokens: 9 frames of 32x32 are
3x4x4 latents. Its config's scale_factor_spatial says so, as the real one's says 16; `spatial=16` builds the
real geometry (64 px clips of 9 frames: 3x4x4 latents).
"""
from __future__ import annotations

from pathlib import Path

Z_DIM = 8   # the real Wan 2.2 VAE's is 48


def tiny_ti2v_vae(spatial: int = 8):
    """spatial: 8 (the tests' tiny model), or 16 as the real Wan 2.2 VAE (a third downsampling)."""
    from diffusers import AutoencoderKLWan
    stages = {8: [True, True], 16: [False, True, True]}[spatial]
    return AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=Z_DIM, dim_mult=[1] * (len(stages) + 1),
                            num_res_blocks=1, attn_scales=[], temperal_downsample=stages, is_residual=True,
                            in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=spatial,
                            scale_factor_temporal=4, latents_mean=[0.05 * (i - Z_DIM / 2) for i in range(Z_DIM)],
                            latents_std=[0.5 + 0.1 * i for i in range(Z_DIM)]).eval()


def tiny_ti2v_components(seed: int = 0, spatial: int = 8) -> dict:
    from diffusers import WanTransformer3DModel
    from .tiny import tiny_components
    parts = tiny_components(seed, experts=1)
    parts["vae"] = tiny_ti2v_vae(spatial)
    parts["transformer"] = WanTransformer3DModel.from_config(
        {**parts["transformer"].config, "in_channels": Z_DIM, "out_channels": Z_DIM})
    return parts


def build_tiny_wan_ti2v(out_dir: str | Path, seed: int = 0, spatial: int = 8) -> Path:
    """Writes a WanPipeline folder with expand_timesteps (`WanPipeline.from_pretrained(out_dir)` loads it)."""
    from diffusers import WanPipeline
    from transformers import AutoTokenizer
    from ..tiny_t5 import write_t5_tokenizer
    out = Path(out_dir)
    tok_dir = write_t5_tokenizer(out / "tokenizer", model_max_length=64)
    pipe = WanPipeline(tokenizer=AutoTokenizer.from_pretrained(tok_dir), expand_timesteps=True,
                       **tiny_ti2v_components(seed, spatial))
    pipe.save_pretrained(out)
    return out
