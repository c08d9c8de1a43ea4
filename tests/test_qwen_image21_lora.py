"""Qwen-Image 2.1 LoRA files in ComfyUI's layout (output.lora_format = "original"): every key names a
weight of the full-size transformer as ComfyUI holds it (fused img_mlp.gate_up; meta device) with the
shapes it needs, diffusers' own converter places the attention keys on the modules we trained, and on
the tiny model the ComfyUI file merged into the ComfyUI-layout transformer, read back by diffusers' own
checkpoint converter, equals the transformer with our diffusers-layout LoRA merged."""
from __future__ import annotations

import copy
import re

import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from trainer_backend.families import get_family, load_model
from trainer_backend.families.qwen_image21 import lora_keys, single_file


class _Model:
    def __init__(self, family, denoiser):
        self.family, self.denoiser = family, denoiser


def _module(key: str) -> str:
    return re.sub(r"\.lora_[AB]\.weight$", "", key)


def test_the_comfyui_layout_names_the_full_size_transformers_own_weights():
    family = get_family("qwen_image21")
    denoiser = family.meta_denoiser()
    comfy = {k.removesuffix(".weight"): v.shape for k, v in single_file.to_original(denoiser.state_dict()).items()}
    denoiser.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=list(family.default_targets)))
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}
    written = family.lora_file_state(_Model(family, denoiser), {"transformer": state}, 1.0, "original")
    blocks = denoiser.config.num_layers
    assert all(k.startswith("diffusion_model.transformer_blocks.") for k in written)
    modules = {_module(k.removeprefix("diffusion_model.")) for k in written}
    assert len(modules) == blocks * 6 and sum(m.endswith("img_mlp.gate_up") for m in modules) == blocks
    for module in modules:
        a = written[f"diffusion_model.{module}.lora_A.weight"]
        b = written[f"diffusion_model.{module}.lora_B.weight"]
        assert module in comfy, f"{module} is not a weight of ComfyUI's Qwen-Image 2.1 transformer"
        assert (b.shape[0], a.shape[1]) == tuple(comfy[module]) and b.shape[1] == a.shape[0]
    # diffusers' own Qwen-Image converter puts the attention keys on exactly the adapted attention modules
    attention = {k: v for k, v in written.items() if ".attn." in k}
    adapted = {name for name, m in denoiser.named_modules() if hasattr(m, "lora_A") and ".attn." in name}
    assert family.diffusers_lora_targets(attention, denoiser) == adapted


def test_the_comfyui_file_merged_and_read_back_by_diffusers_equals_our_lora_merged(tiny_models):
    from diffusers.loaders.single_file_utils import convert_qwen_image21_transformer_checkpoint_to_diffusers
    model = load_model(str(tiny_models("qwen_image21")))
    family = model.family
    base = {k: v.clone() for k, v in model.denoiser.state_dict().items()}
    denoiser = copy.deepcopy(model.denoiser)
    denoiser.add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=list(family.default_targets)))
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=g) * 0.1 for k, v in get_peft_model_state_dict(denoiser).items()}
    ours = family.lora_file_state(_Model(family, denoiser), {"transformer": state}, 8.0, "diffusers")
    comfy = family.lora_file_state(_Model(family, denoiser), {"transformer": state}, 8.0, "original")

    merged_ours = dict(base)
    for key in ours:
        if key.endswith("lora_A.weight"):
            module = _module(key).removeprefix("transformer.")
            update = ours[key.replace("lora_A", "lora_B")] @ ours[key]
            merged_ours[f"{module}.weight"] = base[f"{module}.weight"] + update
    merged_comfy = single_file.to_original(base)
    for key in comfy:
        if key.endswith("lora_A.weight"):
            module = _module(key).removeprefix("diffusion_model.")
            update = comfy[key.replace("lora_A", "lora_B")] @ comfy[key]
            merged_comfy[f"{module}.weight"] = merged_comfy[f"{module}.weight"] + update
    read_back = convert_qwen_image21_transformer_checkpoint_to_diffusers(merged_comfy)
    assert read_back.keys() == merged_ours.keys()
    for key in merged_ours:
        torch.testing.assert_close(read_back[key], merged_ours[key], rtol=1e-6, atol=1e-6)
    changed = [k for k in merged_ours if "img_mlp.gate_layer" in k and not torch.equal(merged_ours[k], base[k])]
    assert changed, "the LoRA did not touch the MLP"
    # our own ComfyUI files read back to exactly our diffusers-layout file (each projection at its own rank)
    back = lora_keys.to_diffusers(comfy)
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)


def test_a_fused_lora_from_another_tool_splits_exactly():
    """lora_down/lora_up with an alpha on img_mlp.gate_up, its B full (not block-diagonal): each projection
    gets the same update the fused weight would."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(6, 8, generator=g), torch.randn(10, 6, generator=g)
    other = {"diffusion_model.transformer_blocks.3.img_mlp.gate_up.lora_down.weight": a,
             "diffusion_model.transformer_blocks.3.img_mlp.gate_up.lora_up.weight": b,
             "diffusion_model.transformer_blocks.3.img_mlp.gate_up.alpha": torch.tensor(3.0)}
    split = lora_keys.to_diffusers(other)
    delta = b @ a * (3.0 / 6)
    gate = split["transformer.transformer_blocks.3.img_mlp.gate_layer.lora_B.weight"] @ \
        split["transformer.transformer_blocks.3.img_mlp.gate_layer.lora_A.weight"]
    up = split["transformer.transformer_blocks.3.img_mlp.proj.lora_B.weight"] @ \
        split["transformer.transformer_blocks.3.img_mlp.proj.lora_A.weight"]
    torch.testing.assert_close(torch.cat([gate, up]), delta)
