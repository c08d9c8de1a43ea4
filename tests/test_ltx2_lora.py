"""LTX-2 LoRA files: ComfyUI's layout on the FULL-SIZE transformer (meta device), video-only and with
the audio stream, reads back through diffusers' own LTX-2 converter onto exactly the adapted modules."""
from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from trainer_backend.families.ltx2.lora_keys import meta_transformer, original_name, targets, to_comfy_lora


@pytest.mark.parametrize("audio", [False, True])
def test_full_size_comfy_keys_all_load_in_diffusers(audio):
    from diffusers import LTX2Pipeline
    denoiser = meta_transformer()
    denoiser.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=targets(audio)))
    adapted = {n for n, m in denoiser.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    layers = denoiser.config.num_layers
    assert len(adapted) == layers * (10 + (18 if audio else 0))
    assert audio == any("audio" in n for n in adapted)
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}
    written = to_comfy_lora({"transformer": state}, 1.0)
    assert all(k.startswith("diffusion_model.transformer_blocks.") for k in written)
    converted = LTX2Pipeline.lora_state_dict(written)
    loaded = {k.removeprefix("transformer.").rsplit(".lora_", 1)[0] for k in converted if "alpha" not in k}
    assert loaded == adapted, (sorted(adapted - loaded)[:5], sorted(loaded - adapted)[:5])


def test_renamed_modules_get_their_original_names():
    assert original_name("proj_in") == "patchify_proj"
    assert original_name("transformer_blocks.3.attn1.to_q") == "transformer_blocks.3.attn1.to_q"
