"""Wan 2.2 LoRA files: ComfyUI's layout on the FULL-SIZE transformers (meta device) reads back through
diffusers' own converter onto exactly the adapted modules; on the tiny two-expert pipeline a LoRA for
the low-noise expert loads with `load_lora_weights(load_into_transformer_2=True)` in both layouts, the
same way, and changes the clip."""
from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from trainer_backend.families.wan.configs import TRANSFORMERS, meta_transformer
from trainer_backend.families.wan.lora_keys import DEFAULT_TARGETS, original_name, to_comfy_lora


@pytest.mark.parametrize("variant", sorted(TRANSFORMERS))
def test_full_size_comfy_keys_all_load_in_diffusers(variant):
    from diffusers import WanPipeline
    denoiser = meta_transformer(variant)
    denoiser.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=list(DEFAULT_TARGETS)))
    adapted = {n for n, m in denoiser.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    assert len(adapted) == TRANSFORMERS[variant]["num_layers"] * 10  # 8 attention + 2 feed-forward linears
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}
    written = to_comfy_lora({"transformer": state}, 1.0)
    assert all(k.startswith("diffusion_model.blocks.") for k in written)
    converted = WanPipeline.lora_state_dict(written)
    loaded = {k.removeprefix("transformer.").rsplit(".lora_", 1)[0] for k in converted}
    assert loaded == adapted, (sorted(adapted - loaded)[:5], sorted(loaded - adapted)[:5])


def test_module_names_outside_the_blocks_are_refused():
    assert original_name("blocks.7.ffn.net.0.proj") == "blocks.7.ffn.0"
    assert original_name("blocks.0.attn2.add_k_proj") == "blocks.0.cross_attn.k_img"
    with pytest.raises(ValueError, match="condition_embedder"):
        original_name("condition_embedder.text_embedder.linear_1")


def test_low_noise_expert_lora_loads_in_both_layouts_and_changes_the_clip(tmp_path):
    from diffusers import WanPipeline
    from safetensors.torch import save_file

    from trainer_backend.families.wan.tiny import build_tiny_wan
    folder = build_tiny_wan(tmp_path / "tiny-wan")

    def clip(pipe):
        return pipe("a red square walks", num_frames=5, height=32, width=32, num_inference_steps=4,
                    guidance_scale=1.0, output_type="np", generator=torch.Generator().manual_seed(0)).frames[0]

    trained = WanPipeline.from_pretrained(folder)
    before = clip(trained)
    trained.transformer_2.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=list(DEFAULT_TARGETS)))
    torch.manual_seed(1)
    for name, p in trained.transformer_2.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    state = get_peft_model_state_dict(trained.transformer_2)
    with_lora = clip(trained)
    assert abs(with_lora - before).max() > 1e-3
    WanPipeline.save_lora_weights(tmp_path / "diffusers", transformer_lora_layers=state)
    save_file(to_comfy_lora({"transformer_2": state}, 2.0), tmp_path / "comfy.safetensors")
    for source in (tmp_path / "diffusers" / "pytorch_lora_weights.safetensors", tmp_path / "comfy.safetensors"):
        pipe = WanPipeline.from_pretrained(folder)
        pipe.load_lora_weights(str(source), load_into_transformer_2=True)
        assert any("lora" in n for n, _ in pipe.transformer_2.named_parameters())
        assert not any("lora" in n for n, _ in pipe.transformer.named_parameters())  # the high-noise expert untouched
        got = clip(pipe)
        assert abs(got - with_lora).max() < 1e-4, source.name
