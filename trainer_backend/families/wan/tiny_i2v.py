"""A tiny random Wan 2.2 I2V pipeline (WanImageToVideoPipeline, as I2V-A14B: two experts, no CLIP image
encoder, boundary_ratio 0.9) for tests: tiny.py's parts, with transformers whose input is the noisy
latents ++ the 4 mask channels ++ the first frame's latents (4 + 4 + 4 = 12 channels; the real one's 36)."""
from __future__ import annotations

from pathlib import Path

from .tiny import Z_DIM, tiny_components

BOUNDARY_RATIO = 0.9   # Wan 2.2 I2V-A14B's own split
MASK_CHANNELS = 4      # the VAE's temporal compression: one mask channel per frame of a latent frame


def tiny_i2v_components(seed: int = 0) -> dict:
    from diffusers import WanTransformer3DModel
    parts = tiny_components(seed, experts=2)
    for name in ("transformer", "transformer_2"):
        config = {**parts[name].config, "in_channels": 2 * Z_DIM + MASK_CHANNELS}
        parts[name] = WanTransformer3DModel.from_config(config)
    parts["boundary_ratio"] = BOUNDARY_RATIO
    return parts


def build_tiny_wan_i2v(out_dir: str | Path, seed: int = 0) -> Path:
    """Writes a WanImageToVideoPipeline folder (`WanImageToVideoPipeline.from_pretrained(out_dir)` loads it)."""
    from diffusers import WanImageToVideoPipeline
    from transformers import AutoTokenizer
    from ..tiny_t5 import write_t5_tokenizer
    out = Path(out_dir)
    tok_dir = write_t5_tokenizer(out / "tokenizer", model_max_length=64)
    pipe = WanImageToVideoPipeline(tokenizer=AutoTokenizer.from_pretrained(tok_dir), **tiny_i2v_components(seed))
    pipe.save_pretrained(out)
    return out
