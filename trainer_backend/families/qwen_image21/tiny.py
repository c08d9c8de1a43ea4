"""A tiny random Qwen-Image 2.1 pipeline, built offline in seconds for tests and the demo: a two-layer
Qwen3-VL (text model and a one-block vision tower, 16-px patches merged 2×2) with the local
Qwen-style BPE tokenizer (families/tiny_qwen.py) and a processor built here (text.py), an RGBA
AutoencoderKLQwenImage21 with 16× spatial compression and its own latents_mean/std, a two-block
QwenImage21Transformer2DModel, and the pipeline's flow-matching scheduler. A 64 px image is a 4×4
latent: 16 tokens."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

Z_DIM = 4
# the image processor's pixel budget: the pipeline resizes a control image to about 1024² (output_resolution), kept
MIN_PIXELS, MAX_PIXELS = 32 * 32, 1024 * 1024


def scheduler_config() -> dict:
    """FlowMatchEulerDiscreteScheduler with the resolution-dependent shift QwenImage21Pipeline computes."""
    return dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential")


def tiny_text_encoder_config(tokenizer):
    from transformers import Qwen3VLConfig
    from ..tiny_qwen import qwen_vocab_size
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, rope_theta=5e6, vocab_size=qwen_vocab_size(),
                rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                max_position_embeddings=2048, rms_norm_eps=1e-6)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0])
    ids = {f"{n}_token_id": tokenizer.convert_tokens_to_ids(t) for n, t in (
        ("image", "<|image_pad|>"), ("video", "<|video_pad|>"), ("vision_start", "<|vision_start|>"),
        ("vision_end", "<|vision_end|>"))}
    return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)


def build_tiny_qwen_image21(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from diffusers import (AutoencoderKLQwenImage21, FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline,
                           QwenImage21Transformer2DModel)
    from transformers import Qwen2Tokenizer, Qwen3VLForConditionalGeneration
    from ..tiny_qwen import build_qwen_tokenizer
    from .text import build_processor, save_processor

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-qwen-image21-tok-"))
    try:
        tokenizer = Qwen2Tokenizer.from_pretrained(str(build_qwen_tokenizer(staging / "tokenizer", 2048)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    processor = build_processor(tokenizer, MIN_PIXELS, MAX_PIXELS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = QwenImage21Transformer2DModel(in_channels=Z_DIM, out_channels=Z_DIM, num_layers=2,
                                                    attention_head_dim=16, num_attention_heads=2, context_in_dim=32,
                                                    axes_dims_rope=(4, 6, 6))
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLQwenImage21(base_dim=8, decoder_base_dim=8, z_dim=Z_DIM, dim_mult=[1, 1, 1, 1, 1],
                                       num_res_blocks=1, temperal_downsample=[False, True, True, True],
                                       latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.9, 1.2, 1.1])
        torch.manual_seed(seed + 2)
        text_encoder = Qwen3VLForConditionalGeneration(tiny_text_encoder_config(tokenizer))
    pipe = QwenImage21Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config()), vae=vae,
                               text_encoder=text_encoder, processor=processor, transformer=transformer)
    pipe.register_modules(processor=None)  # diffusers cannot save it without torchvision: text.py writes it
    pipe.save_pretrained(out, safe_serialization=True)
    save_processor(processor, out / "processor", out / "model_index.json")
    return out
