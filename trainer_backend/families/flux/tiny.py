"""A tiny random Flux.1 pipeline (dev-like: with the guidance embedding; `schnell=True`: without),
built offline in seconds for tests and the demo: CLIP-L (pooled) and a small T5 encoder with
offline tokenizers, a 16-channel KL VAE with Flux's scale and shift, a FluxTransformer2DModel with
one double and one single block, and Flux's flow-matching scheduler. The VAE downsamples by 2,
so a 32 px image is a 16×16 latent and 64 packed tokens."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

T5_MAX_LENGTH = 32  # the tiny T5's tokenizer limit (the real ones: dev 512, schnell 256)


def scheduler_config() -> dict:
    """FlowMatchEulerDiscreteScheduler as Flux.1 ships it (resolution-dependent shift)."""
    return dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                base_image_seq_len=256, max_image_seq_len=4096)


def tiny_t5_encoder():
    """The tiny T5 encoder (32 wide, gated GELU like T5 v1.1) on the offline tokenizer's vocabulary;
    random weights from the global torch seed."""
    from transformers import T5Config, T5EncoderModel
    from ..tiny_t5 import t5_vocab_size
    return T5EncoderModel(T5Config(vocab_size=t5_vocab_size(), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=8, dense_act_fn="gelu_new", is_gated_act=True,
                                   feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
                                   decoder_start_token_id=0))


def build_tiny_flux(out_dir: str | Path, seed: int = 0, schnell: bool = False) -> Path:
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Tokenizer
    from ..sd.tiny import _text_encoder_config
    from ..sd.tiny_tokenizer import EOS, write_tokenizer
    from ..flow_common import tiny_vae_16ch
    from ..tiny_t5 import write_t5_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-flux-tok-"))
    try:
        tokenizer = CLIPTokenizer.from_pretrained(write_tokenizer(staging / "tokenizer", pad_token=EOS))
        tokenizer_2 = T5Tokenizer.from_pretrained(str(write_t5_tokenizer(staging / "tokenizer_2", T5_MAX_LENGTH)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                             pooled_projection_dim=32, guidance_embeds=not schnell,
                                             axes_dims_rope=(4, 6, 6))
        torch.manual_seed(seed + 1)
        vae = tiny_vae_16ch(0.3611, 0.1159)
        torch.manual_seed(seed + 2)
        text_encoder = CLIPTextModel(CLIPTextConfig(**_text_encoder_config(32, tokenizer.pad_token_id,
                                                                           open_clip=False)))
        torch.manual_seed(seed + 3)
        text_encoder_2 = tiny_t5_encoder()
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config()), vae=vae,
                        text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2,
                        tokenizer_2=tokenizer_2, transformer=transformer)
    pipe.save_pretrained(out, safe_serialization=True)
    # the plain tokenizer layouts (loads everywhere): CLIP vocab/merges, T5 tokenizer.json
    shutil.rmtree(out / "tokenizer")
    write_tokenizer(out / "tokenizer", pad_token=EOS)
    shutil.rmtree(out / "tokenizer_2")
    write_t5_tokenizer(out / "tokenizer_2", T5_MAX_LENGTH)
    return out
