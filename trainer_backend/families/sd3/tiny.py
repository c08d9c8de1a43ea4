"""A tiny random SD3.5-style pipeline, built offline in seconds for tests and the demo: CLIP-L and
CLIP-G with projections (different widths, as diffusers' loaders need to tell them apart), a small
T5 with an offline tokenizer, a 16-channel KL VAE with SD3's scale and shift, an
SD3Transformer2DModel with two joint blocks (the first with SD3.5's dual attention, qk RMS norm),
and SD3's flow-matching scheduler (shift 3). The VAE downsamples by 2: 32 px is a 16×16 latent."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

T5_MAX_LENGTH = 32  # the tiny T5's tokenizer limit (SD3's own: 256)
CLIP_WIDTHS = (32, 48)


def build_tiny_sd3(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import (CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer, T5Config, T5EncoderModel,
                              T5Tokenizer)
    from ..sd.tiny import _text_encoder_config
    from ..sd.tiny_tokenizer import EOS, write_tokenizer
    from ..flow_common import tiny_vae_16ch
    from ..tiny_t5 import t5_vocab_size, write_t5_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-sd3-tok-"))
    try:
        tokenizer = CLIPTokenizer.from_pretrained(write_tokenizer(staging / "tokenizer", pad_token=EOS))
        tokenizer_2 = CLIPTokenizer.from_pretrained(write_tokenizer(staging / "tokenizer_2", pad_token="!"))
        tokenizer_3 = T5Tokenizer.from_pretrained(str(write_t5_tokenizer(staging / "tokenizer_3", T5_MAX_LENGTH)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    joint_dim = sum(CLIP_WIDTHS)  # the CLIP hidden states are padded to the T5 width
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=16, num_layers=2,
                                            attention_head_dim=16, num_attention_heads=4, joint_attention_dim=joint_dim,
                                            caption_projection_dim=64, pooled_projection_dim=64, out_channels=16,
                                            pos_embed_max_size=32, dual_attention_layers=(0,), qk_norm="rms_norm")
        torch.manual_seed(seed + 1)
        vae = tiny_vae_16ch(1.5305, 0.0609)
        encoders = []
        for i, (width, tok) in enumerate(zip(CLIP_WIDTHS, (tokenizer, tokenizer_2))):
            torch.manual_seed(seed + 2 + i)
            encoders.append(CLIPTextModelWithProjection(CLIPTextConfig(**_text_encoder_config(
                width, tok.pad_token_id, open_clip=i == 1, projection_dim=32))))
        torch.manual_seed(seed + 4)
        text_encoder_3 = T5EncoderModel(T5Config(vocab_size=t5_vocab_size(), d_model=joint_dim, d_kv=8, d_ff=64,
                                                 num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                                 dense_act_fn="gelu_new", is_gated_act=True,
                                                 feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
                                                 decoder_start_token_id=0))
    pipe = StableDiffusion3Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
                                    vae=vae, text_encoder=encoders[0], tokenizer=tokenizer, text_encoder_2=encoders[1],
                                    tokenizer_2=tokenizer_2, text_encoder_3=text_encoder_3, tokenizer_3=tokenizer_3,
                                    transformer=transformer)
    pipe.save_pretrained(out, safe_serialization=True)
    for sub, pad in (("tokenizer", EOS), ("tokenizer_2", "!")):
        shutil.rmtree(out / sub)
        write_tokenizer(out / sub, pad_token=pad)
    shutil.rmtree(out / "tokenizer_3")
    write_t5_tokenizer(out / "tokenizer_3", T5_MAX_LENGTH)
    return out
