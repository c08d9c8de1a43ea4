"""Tiny random Qwen-Image and Qwen-Image-Edit pipelines, built offline in seconds for tests and the
demo: a two-layer Qwen2.5-VL (text model and a one-block vision tower) with the local Qwen-style
BPE tokenizer (families/tiny_qwen.py), a 3D causal AutoencoderKLQwenImage with 8× spatial
compression and its own latents_mean/std, a two-block QwenImageTransformer2DModel, and Qwen-Image's
flow-matching scheduler. The edit models (Qwen-Image-Edit, -2509's Edit-Plus pipeline, -2511's
zero_cond_t transformer) add the vision-language processor (text.py builds it
locally: no download). A 64 px image is an 8×8 latent and 16 packed tokens."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

Z_DIM = 4
# the image processor's pixel budget: a control image becomes at most 16 vision tokens
MIN_PIXELS, MAX_PIXELS = 28 * 28, 28 * 28 * 16


def scheduler_config() -> dict:
    """FlowMatchEulerDiscreteScheduler as Qwen-Image ships it (resolution-dependent exponential shift)."""
    return dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential")


def tiny_text_encoder_config():
    """A two-layer Qwen2.5-VL whose ids cover the tiny tokenizer (multimodal RoPE sections sum to head_dim/2)."""
    from transformers import Qwen2_5_VLConfig
    from ..tiny_qwen import ENDOFTEXT, IM_END, qwen_vocab_size, special_token_id
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [2, 3, 3]}, rope_theta=1e6,
                vocab_size=qwen_vocab_size(), max_position_embeddings=2048, rms_norm_eps=1e-6,
                eos_token_id=special_token_id(IM_END), pad_token_id=special_token_id(ENDOFTEXT))
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[0])
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, vocab_size=qwen_vocab_size(),
                            image_token_id=special_token_id("<|image_pad|>"),
                            video_token_id=special_token_id("<|video_pad|>"),
                            vision_start_token_id=special_token_id("<|vision_start|>"),
                            vision_end_token_id=special_token_id("<|vision_end|>"), tie_word_embeddings=False)


def build_tiny_qwen_image(out_dir: str | Path, seed: int = 0, edit: bool = False, plus: bool = False,
                          zero_cond_t: bool = False) -> Path:
    """plus: Qwen-Image-Edit-2509's pipeline (QwenImageEditPlusPipeline); zero_cond_t: 2511's transformer."""
    import torch
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline,
                           QwenImageEditPlusPipeline, QwenImagePipeline, QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer
    from ..tiny_qwen import build_qwen_tokenizer
    from .text import build_processor, save_processor

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-qwen-image-tok-"))
    try:
        tokenizer = Qwen2Tokenizer.from_pretrained(str(build_qwen_tokenizer(staging / "tokenizer", 1024 + 64)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=Z_DIM * 4, out_channels=Z_DIM, num_layers=2,
                                                  attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                                  axes_dims_rope=(8, 4, 4), zero_cond_t=zero_cond_t)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLQwenImage(base_dim=8, z_dim=Z_DIM, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                     temperal_downsample=[False, True, True],
                                     latents_mean=[0.12, -0.31, 0.25, 0.05], latents_std=[1.6, 0.9, 1.3, 1.1])
        torch.manual_seed(seed + 2)
        text_encoder = Qwen2_5_VLForConditionalGeneration(tiny_text_encoder_config())
    parts = dict(scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config()), vae=vae, text_encoder=text_encoder,
                 tokenizer=tokenizer, transformer=transformer)
    if edit:
        processor = build_processor(tokenizer, MIN_PIXELS, MAX_PIXELS)
        pipe = (QwenImageEditPlusPipeline if plus else QwenImageEditPipeline)(processor=processor, **parts)
        # the processor cannot be saved by diffusers without torchvision (text.py): write it ourselves
        pipe.register_modules(processor=None)
        pipe.save_pretrained(out, safe_serialization=True)
        save_processor(processor, out / "processor", out / "model_index.json")
    else:
        QwenImagePipeline(**parts).save_pretrained(out, safe_serialization=True)
    return out
