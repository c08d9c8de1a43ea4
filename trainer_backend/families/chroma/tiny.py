"""A tiny random Chroma pipeline, built offline in seconds for tests and the demo: Flux's tiny T5
encoder with the offline T5 tokenizer, Flux's 16-channel KL VAE (Chroma uses FLUX.1's autoencoder),
a ChromaTransformer2DModel with one double block, one single block and a one-layer approximator, and
Flux's flow-matching scheduler (Chroma1-HD ships the same one). A 32 px image is a 16×16 latent."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..flux.tiny import T5_MAX_LENGTH, scheduler_config, tiny_t5_encoder


def build_tiny_chroma(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler
    from transformers import T5Tokenizer
    from ..flow_common import tiny_vae_16ch
    from ..tiny_t5 import write_t5_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-chroma-tok-"))
    try:
        tokenizer = T5Tokenizer.from_pretrained(str(write_t5_tokenizer(staging / "tokenizer", T5_MAX_LENGTH)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # approximator_num_channels is 4 sinusoid widths (time, guidance, 2× block index): a multiple of 8
        transformer = ChromaTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                               attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                               axes_dims_rope=(4, 6, 6), approximator_num_channels=16,
                                               approximator_hidden_dim=32, approximator_layers=1)
        torch.manual_seed(seed + 1)
        vae = tiny_vae_16ch(0.3611, 0.1159)
        torch.manual_seed(seed + 3)
        text_encoder = tiny_t5_encoder()
    pipe = ChromaPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config()), vae=vae,
                          text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)
    pipe.save_pretrained(out, safe_serialization=True)
    shutil.rmtree(out / "tokenizer")  # the plain T5 tokenizer.json layout (loads everywhere)
    write_t5_tokenizer(out / "tokenizer", T5_MAX_LENGTH)
    return out
