"""SD3 / SD3.5 LoRA files in kohya's layout (output.lora_format = "kohya"): the names are the original
(Stability AI) MMDiT modules kohya's sd-scripts and ComfyUI look up (`lora_unet_joint_blocks_…`, q/k/v
fused; `lora_te1_`/`lora_te2_` for CLIP-L/CLIP-G), shapes fitting the full-size architectures; merged
the way ComfyUI and kohya merge, a run's file gives the same transformer as the same run's diffusers
file loaded and fused by diffusers."""
from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.families import get_family, load_model
from trainer_backend.families.sd3.kohya_lora import merge_into_original, to_kohya_sd3
from trainer_backend.families.sd3.single_file import from_original, to_original

SD3 = get_family("sd3")


def _random_lora(module, targets, rank, seed=0, alpha=1.0):
    module.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets))
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * 0.1 for k, v in get_peft_model_state_dict(module).items()}


@pytest.mark.parametrize("variant,blocks,dual", [("transformer", 24, 13), ("transformer_large", 38, 0)])
def test_full_size_kohya_names_are_the_original_modules(variant, blocks, dual):
    """On the meta device: every name is a Linear layer of the full-size original-layout model inside
    the joint blocks (where kohya's loader builds its modules), with fitting shapes; q/k/v fused."""
    from diffusers import SD3Transformer2DModel
    from trainer_backend.families.component_files import bundled
    config = bundled("sd3", f"{variant}/config.json")
    with torch.device("meta"):
        denoiser = SD3Transformer2DModel.from_config(config)
    original = to_original(denoiser.state_dict(), config)
    targets = list(SD3.default_targets)
    written = to_kohya_sd3({"transformer": _random_lora(denoiser, targets, rank=2)}, 1.0, denoiser)
    by_name = {k[: -len(".weight")].replace(".", "_"): v.shape for k, v in original.items()
               if k.endswith(".weight") and v.dim() == 2}
    names = {k.split(".")[0] for k in written}
    assert all(n.startswith("lora_unet_joint_blocks_") for n in names)
    for n in names:
        shape = by_name[n[len("lora_unet_"):]]
        assert written[f"{n}.lora_up.weight"].shape[0] == shape[0]
        assert written[f"{n}.lora_down.weight"].shape[1] == shape[1]
    last = blocks - 1
    assert "lora_unet_joint_blocks_0_x_block_attn_qkv" in names
    assert f"lora_unet_joint_blocks_{last}_context_block_attn_qkv" in names
    assert f"lora_unet_joint_blocks_{last}_context_block_attn_proj" not in names  # the last block has none
    # per block: x and context qkv, x proj; context proj but in the last; attn2 qkv and proj where dual
    assert len(names) == blocks * 3 + (blocks - 1) + dual * 2


def test_full_size_text_encoder_names_are_kohyas():
    """CLIP-L and CLIP-G adapters are named on transformers 4's module paths with lora_te1/lora_te2,
    as kohya's lora_sd3.py names them (T5 adapters are refused: T5 stays frozen)."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection
    from trainer_backend.families.component_files import bundled
    states = {}
    with torch.device("meta"):
        for i, component in enumerate(("text_encoder", "text_encoder_2")):
            te = CLIPTextModelWithProjection(CLIPTextConfig(**bundled("sd3", f"{component}/config.json")))
            states[component] = _random_lora(te, list(SD3.default_text_encoder_targets), rank=2, seed=i)
    written = to_kohya_sd3(states, 1.0, SD3.meta_denoiser())
    names = {k.split(".")[0] for k in written}
    assert {n.split("_text_model_")[0] for n in names} == {"lora_te1", "lora_te2"}
    assert "lora_te1_text_model_encoder_layers_11_self_attn_out_proj" in names
    assert "lora_te2_text_model_encoder_layers_31_self_attn_q_proj" in names
    assert len(names) == 4 * (12 + 32)
    with pytest.raises(ValueError, match="no place for text_encoder_3"):
        to_kohya_sd3({"text_encoder_3": {"x.lora_A.weight": torch.zeros(1, 1), "x.lora_B.weight": torch.zeros(1, 1)}},
                     1.0, SD3.meta_denoiser())


def test_the_fused_file_merges_into_exactly_the_adapted_model(tiny_models):
    """A LoRA on every kind of module (attention, dual attention, MLPs, the norms' modulation, the
    final layers), a different alpha per module: merged into the original-layout weights and read back
    by diffusers' converter, it equals peft's own merge, the swapped halves of the last blocks too."""
    model = load_model(str(tiny_models("sd3")))
    denoiser = model.denoiser
    base = to_original(denoiser.state_dict(), dict(denoiser.config))
    targets = ["to_q", "to_k", "to_v", "to_out.0", "add_k_proj", "to_add_out", "ff.net.2", "ff_context.net.0.proj",
               "norm1.linear", "norm1_context.linear", "norm_out.linear", "proj_out", "context_embedder"]
    state = _random_lora(denoiser, targets, rank=3)
    from peft.utils import set_peft_model_state_dict
    set_peft_model_state_dict(denoiser, state)
    alpha = lambda component, module: 2.0 if "attn2" in module else 3.0  # noqa: E731
    written = to_kohya_sd3({"transformer": state}, alpha, denoiser)
    from peft.tuners.lora import LoraLayer
    for name, module in denoiser.named_modules():  # peft's own merge, scaled by each module's alpha / rank
        if isinstance(module, LoraLayer):
            module.scaling["default"] = alpha("transformer", name) / 3
            module.merge()
    merged_by_peft = {k.replace(".base_layer", ""): v for k, v in denoiser.state_dict().items() if "lora_" not in k}
    merged = from_original(merge_into_original(base, written))
    assert merged.keys() == merged_by_peft.keys()
    worst = max((merged[k] - merged_by_peft[k]).abs().max().item() for k in merged)
    assert worst < 1e-5, worst
    moved = max((merged[k] - from_original(dict(base))[k]).abs().max().item() for k in merged)
    assert moved > 1e-3


def test_a_kohya_run_holds_the_update_diffusers_applies_from_the_same_runs_diffusers_file(tmp_path, tiny_models):
    """Two runs, same seed, one writing diffusers' layout and one kohya's (CLIP-L and CLIP-G trained too):
    the kohya file has kohya's names and ss_* metadata, and merged the ComfyUI/kohya way it gives the
    transformer diffusers gets by loading and fusing the diffusers file; that transformer moved."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    common = ["schedule.max_steps=1", "optimizer.lr=1e-2", "network.train_text_encoder=true", "schedule.seed=5"]
    kohya, _, _ = train_run(tmp_path, tiny_models("sd3"), data, "kohya", "output.lora_format=kohya", *common)
    plain, _, _ = train_run(tmp_path, tiny_models("sd3"), data, "plain", *common)
    with safe_open(str(kohya / "kohya.safetensors"), "pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    assert {"lora_unet_joint_blocks_0_x_block_attn_qkv.lora_up.weight",
            "lora_unet_joint_blocks_0_x_block_attn2_qkv.alpha",
            "lora_unet_joint_blocks_1_x_block_attn_proj.lora_down.weight"} <= keys
    assert any(k.startswith("lora_te1_text_model_encoder_layers_0_self_attn_q_proj") for k in keys)
    assert any(k.startswith("lora_te2_text_model_encoder_layers_0_self_attn_q_proj") for k in keys)
    # kohya's sd3 model type of the tiny SD3.5 Medium-like model (dual attention, q/k norm), its network module
    assert meta["ss_base_model_version"] == "5-medium" and meta["ss_network_dim"] == "4"
    assert meta["ss_network_module"] == "networks.lora_sd3"

    pipe = SD3.build_pipeline(load_model(str(tiny_models("sd3"))))
    base = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    pipe.load_lora_weights(str(plain / "plain.safetensors"))
    pipe.fuse_lora(components=["transformer"])
    pipe.unload_lora_weights()
    fused = pipe.transformer.state_dict()
    merged = from_original(merge_into_original(to_original(base, dict(pipe.transformer.config)),
                                               load_file(str(kohya / "kohya.safetensors"))))
    assert max((merged[k] - fused[k]).abs().max().item() for k in fused) < 1e-5
    assert max((fused[k] - base[k]).abs().max().item() for k in fused) > 1e-4, "training moved nothing"
