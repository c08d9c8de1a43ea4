"""A tiny random Ideogram 4 pipeline for tests and the demo: two one-block Ideogram4Transformer2DModels
(the conditional one that trains and the unconditional one the pipeline's asymmetric guidance blends in),
a 36-layer (the fewest that have the pipeline's tapped layers 0, 3, ..., 33, 35, as Qwen3-VL-8B) but
16-wide Qwen3-VL text model with the offline Qwen tokenizer (families/tiny_qwen.py) and a Qwen3-VL chat
template, and a three-level AutoencoderKLFlux2 with 8 latent channels (32 after the 2x2 patchify) whose
batch-norm statistics are random, so a latent normalisation gone wrong shows. About 0.4 M parameters."""
from __future__ import annotations

from pathlib import Path

TEXT_MAX_LENGTH = 2048  # the pipeline's max_sequence_length; captions are cached at the family's length
WIDTH = 16              # the text model's hidden size: the transformer reads 13 x 16 features per token
# Qwen3-VL's template for a user turn whose content is a list of parts (the pipeline's messages)
VL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- else -%}"
    "{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '<|im_end|>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


def scheduler_config() -> dict:
    """FlowMatchEulerDiscreteScheduler as the pipeline uses it (it sets its own logit-normal sigmas)."""
    return dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False)


def tiny_text_encoder_config():
    from transformers import Qwen3VLConfig
    from ..tiny_qwen import ENDOFTEXT, IM_END, qwen_vocab_size, special_token_id
    text = dict(hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=36, num_attention_heads=2,
                num_key_value_heads=1, head_dim=8, vocab_size=qwen_vocab_size(), max_position_embeddings=4096,
                rms_norm_eps=1e-6, pad_token_id=special_token_id(ENDOFTEXT), eos_token_id=special_token_id(IM_END),
                rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=WIDTH, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16, deepstack_visual_indexes=[])
    return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                         image_token_id=special_token_id("<|image_pad|>"),
                         video_token_id=special_token_id("<|video_pad|>"),
                         vision_start_token_id=special_token_id("<|vision_start|>"),
                         vision_end_token_id=special_token_id("<|vision_end|>"))


def tiny_transformer(seed: int):
    import torch
    from diffusers import Ideogram4Transformer2DModel
    torch.manual_seed(seed)
    return Ideogram4Transformer2DModel(in_channels=32, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                                       intermediate_size=32, adaln_dim=16, llm_features_dim=13 * WIDTH,
                                       mrope_section=(2, 1, 1))


def build_tiny_ideogram4(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Ideogram4Pipeline
    from transformers import Qwen2Tokenizer, Qwen3VLModel
    from ..tiny_qwen import build_qwen_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    folder = build_qwen_tokenizer(out / "tokenizer", TEXT_MAX_LENGTH)
    tokenizer = Qwen2Tokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    with torch.random.fork_rng(devices=[]):
        transformer = tiny_transformer(seed)
        unconditional = tiny_transformer(seed + 3)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLFlux2(latent_channels=8, layers_per_block=1, block_out_channels=(16, 32, 32),
                                 norm_num_groups=8, sample_size=32, down_block_types=("DownEncoderBlock2D",) * 3,
                                 up_block_types=("UpDecoderBlock2D",) * 3)
        vae.bn.running_mean.copy_(torch.randn(32) * 0.2)
        vae.bn.running_var.copy_(torch.rand(32) + 0.5)
        torch.manual_seed(seed + 2)
        text_encoder = Qwen3VLModel(tiny_text_encoder_config())
    pipe = Ideogram4Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config()), vae=vae,
                             text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer,
                             unconditional_transformer=unconditional)
    pipe.save_pretrained(out, safe_serialization=True)
    return out
