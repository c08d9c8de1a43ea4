"""A tiny random Flux.2 Klein pipeline for tests and the demo: a Flux2Transformer2DModel with one double
and one single block, a 28-layer (the fewest that have the pipeline's hidden layers 9, 18 and 27, before
the final norm, as in the 36-layer Qwen3-4B/8B) but 32-wide Qwen3 text encoder with the offline Qwen tokenizer (families/tiny_qwen.py), and a three-level
AutoencoderKLFlux2 with 8 latent channels (32 after the 2x2 patchify) whose batch-norm statistics are
random, so a latent normalisation gone wrong shows.

`dev=True`: the Flux.2 dev pipeline (Flux2Pipeline) instead: the transformer with the guidance embedding,
and a 31-layer (the fewest with the pipeline's hidden layers 10, 20 and 30 before the final norm, as in
Mistral Small 3's 40) 32-wide Mistral-3 text encoder with a one-layer Pixtral tower and the offline
Mistral tokenizer (tiny_mistral.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

TEXT_MAX_LENGTH = 64  # the tiny tokenizer's limit: tokens per caption (the real models: 512)
# dev's system message alone is ~60 tiny tokens (~25 real ones): room for it and a caption
DEV_TEXT_MAX_LENGTH = 160


def scheduler_config() -> dict:
    """FlowMatchEulerDiscreteScheduler as the Flux.2 repos ship it (the pipeline sets its own mu)."""
    return dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential")


def build_tiny_flux2(out_dir: str | Path, seed: int = 0, dev: bool = False) -> Path:
    import torch
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, \
        Flux2Pipeline, Flux2Transformer2DModel
    from transformers import AutoTokenizer, Mistral3ForConditionalGeneration, Qwen2Tokenizer, Qwen3ForCausalLM
    from ..tiny_qwen import build_qwen_tokenizer, tiny_qwen3_config
    from .tiny_mistral import build_mistral_tokenizer, tiny_mistral3_config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if dev:
        tokenizer = AutoTokenizer.from_pretrained(str(build_mistral_tokenizer(out / "tokenizer", DEV_TEXT_MAX_LENGTH)))
    else:
        tokenizer = Qwen2Tokenizer.from_pretrained(str(build_qwen_tokenizer(out / "tokenizer", TEXT_MAX_LENGTH)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = Flux2Transformer2DModel(patch_size=1, in_channels=32, num_layers=1, num_single_layers=1,
                                              attention_head_dim=16, num_attention_heads=2, joint_attention_dim=96,
                                              timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4),
                                              guidance_embeds=dev)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLFlux2(latent_channels=8, layers_per_block=1, block_out_channels=(16, 32, 32),
                                 norm_num_groups=8, sample_size=32, down_block_types=("DownEncoderBlock2D",) * 3,
                                 up_block_types=("UpDecoderBlock2D",) * 3)
        vae.bn.running_mean.copy_(torch.randn(32) * 0.2)
        vae.bn.running_var.copy_(torch.rand(32) + 0.5)
        torch.manual_seed(seed + 2)
        if dev:
            text_encoder = Mistral3ForConditionalGeneration(tiny_mistral3_config(hidden_size=32, num_hidden_layers=31))
        else:
            text_encoder = Qwen3ForCausalLM(tiny_qwen3_config(hidden_size=32, num_hidden_layers=28))
    pipeline = Flux2Pipeline if dev else Flux2KleinPipeline
    pipe = pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config()), vae=vae,
                    text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)
    pipe.save_pretrained(out, safe_serialization=True)
    if dev:
        return out
    shutil.rmtree(out / "tokenizer")  # the plain layout (vocab.json, merges.txt), loadable everywhere
    build_qwen_tokenizer(out / "tokenizer", TEXT_MAX_LENGTH)
    return out
