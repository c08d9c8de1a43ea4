"""Flux LoRA files in kohya's layout (output.lora_format = "kohya"): the names are the original
(Black Forest Labs) modules kohya's sd-scripts, ComfyUI and Forge look up, q/k/v (and a single
block's MLP input) fused; diffusers' own converter reads them back onto the trained modules with
the trained update; merged the way ComfyUI and kohya merge, they give the trained model."""
from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import ROOT, make_dataset
from method_runs import train_run
from trainer_backend.families import get_family, load_model
from trainer_backend.families.flux.kohya_lora import merge_into_original, to_kohya_flux
from trainer_backend.families.flux.single_file import from_original, to_original

FLUX = get_family("flux")


def _random_lora(module, targets, rank, seed=0, alpha=1.0):
    module.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets))
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * 0.1 for k, v in get_peft_model_state_dict(module).items()}


def test_full_size_kohya_names_are_the_original_modules_and_diffusers_converts_them_exactly():
    denoiser = FLUX.meta_denoiser()
    original = to_original(denoiser.state_dict(), dict(denoiser.config))
    state = _random_lora(denoiser, list(FLUX.default_targets), rank=2)
    adapted = {k[: -len(".lora_A.weight")] for k in state if k.endswith("lora_A.weight")}
    written = to_kohya_flux({"transformer": state}, 1.0, denoiser)

    # kohya's loader (networks/lora_flux.py) names a module lora_unet_<original path with _> and only
    # looks inside the double and single blocks: every name must be one of those Linear layers, shapes fitting
    by_name = {k[: -len(".weight")].replace(".", "_"): v.shape for k, v in original.items()
               if k.endswith(".weight") and v.dim() == 2}
    names = {k.split(".")[0] for k in written}
    assert all(n.startswith(("lora_unet_double_blocks_", "lora_unet_single_blocks_")) for n in names)
    for n in names:
        shape = by_name[n[len("lora_unet_"):]]
        assert written[f"{n}.lora_up.weight"].shape[0] == shape[0]
        assert written[f"{n}.lora_down.weight"].shape[1] == shape[1]
    assert "lora_unet_double_blocks_18_img_attn_qkv" in names and "lora_unet_single_blocks_37_linear1" in names
    assert len(names) == 19 * 4 + 38  # img/txt qkv (fused) and proj per double block; one linear1 per single

    # diffusers' own converter puts it back on exactly the trained modules with the trained update
    assert FLUX.diffusers_lora_targets(written, denoiser) == adapted
    converted = FLUX.pipeline_class().lora_state_dict(dict(written))
    converted = converted[0] if isinstance(converted, tuple) else converted
    probe = torch.randn(3072 * 4, 3, generator=torch.Generator().manual_seed(1))
    for module in sorted(adapted):
        a, b = state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"]
        ca, cb = converted[f"transformer.{module}.lora_A.weight"], converted[f"transformer.{module}.lora_B.weight"]
        x = probe[: a.shape[1]]
        want = (1.0 / a.shape[0]) * (b @ (a @ x))  # alpha / rank
        assert torch.allclose(cb @ (ca @ x), want, atol=1e-6, rtol=1e-5), module


def test_full_size_clip_l_adapters_use_kohya_te1_names_that_diffusers_converts():
    from transformers import CLIPTextConfig, CLIPTextModel
    config = CLIPTextConfig.from_json_file(str(ROOT / "assets/model_configs/sd1/text_encoder/config.json"))
    with torch.device("meta"):
        clip = CLIPTextModel(config)  # CLIP ViT-L/14's text tower, as Flux.1 uses it
    state = _random_lora(clip, list(FLUX.default_text_encoder_targets), rank=2)
    written = to_kohya_flux({"text_encoder": state}, 2.0, None)
    assert "lora_te1_text_model_encoder_layers_11_self_attn_q_proj.lora_down.weight" in written
    assert len(written) == 3 * len(state) // 2
    converted = FLUX.pipeline_class().lora_state_dict(dict(written))
    converted = converted[0] if isinstance(converted, tuple) else converted
    assert len(converted) == len(state) and all(k.startswith("text_encoder.") for k in converted)


def test_tiny_flux_kohya_file_merged_like_comfyui_equals_the_trained_model(tiny_models):
    """Every default target (linear1 fused four ways, q/k/v three ways): W + alpha/rank · up @ down on
    the original-layout weights, loaded back, equals peft's merge of the trained adapters."""
    model = load_model(str(tiny_models("flux")))
    base = {k: v.clone() for k, v in model.denoiser.state_dict().items()}
    config = dict(model.denoiser.config)
    state = _random_lora(model.denoiser, list(FLUX.default_targets), rank=3, seed=2, alpha=5.0)
    model.denoiser.load_state_dict({k.replace("lora_A.", "lora_A.default.").replace("lora_B.", "lora_B.default."): v
                                    for k, v in state.items()}, strict=False)
    written = FLUX.lora_file_state(model, {"transformer": state}, 5.0, "kohya")
    merged = merge_into_original(to_original(base, config), written)

    model.denoiser.fuse_lora(lora_scale=1.0)  # peft's own merge: W + alpha/r · B @ A
    model.denoiser.unload_lora()
    trained = model.denoiser.state_dict()
    back = from_original(merged, trained, config)
    assert back.keys() == trained.keys()
    worst = max((back[k] - trained[k]).abs().max().item() for k in trained)
    assert worst < 1e-5, worst
    assert max((trained[k] - base[k]).abs().max().item() for k in trained) > 1e-2, "the adapters changed nothing"


def _image(pipe):
    g = torch.Generator().manual_seed(0)
    return torch.from_numpy(pipe("a red square", num_inference_steps=2, height=64, width=64, generator=g,
                                 output_type="np").images[0])


def test_kohya_format_run_is_read_by_diffusers_as_comfyui_merges_it(tmp_path, tiny_models):
    """A real run with output.lora_format = kohya (CLIP-L trained too), on targets diffusers' converter
    handles at any size (its single-block split assumes the full-size widths): the file has kohya's
    names and ss_* metadata; diffusers' load_lora_weights changes the image, and its fused transformer
    equals the base with the file merged into the original-layout weights (ComfyUI's, kohya's way)."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    targets = json.dumps(["to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "ff.net.2"])
    run, _, _ = train_run(tmp_path, tiny_models("flux"), data, "kohya", "output.lora_format=kohya",
                          "schedule.max_steps=2", "optimizer.lr=1e-2", "network.train_text_encoder=true",
                          f"network.target_modules={targets}")
    out = run / "kohya.safetensors"
    with safe_open(str(out), "pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    assert "lora_unet_double_blocks_0_txt_attn_qkv.lora_up.weight" in keys
    assert "lora_unet_double_blocks_0_img_mlp_2.alpha" in keys
    assert any(k.startswith("lora_te1_text_model_encoder_layers_0_self_attn_q_proj") for k in keys)
    assert meta["ss_base_model_version"] == "flux1" and meta["ss_network_dim"] == "4"

    pipe = FLUX.build_pipeline(load_model(str(tiny_models("flux"))))
    base = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    before = _image(pipe)
    pipe.load_lora_weights(str(out))
    assert (_image(pipe) - before).abs().max() > 1e-3, "the LoRA did not change the output"
    assert any("lora" in n for n, _ in pipe.text_encoder.named_parameters())
    pipe.fuse_lora(components=["transformer"])
    pipe.unload_lora_weights()
    fused = pipe.transformer.state_dict()
    config = dict(pipe.transformer.config)
    merged = from_original(merge_into_original(to_original(base, config), load_file(str(out))), fused, config)
    assert max((merged[k] - fused[k]).abs().max().item() for k in fused) < 1e-5
    assert max((fused[k] - base[k]).abs().max().item() for k in fused) > 1e-4, "training moved nothing"


@pytest.mark.parametrize("arch", ["sd1", "sdxl"])
def test_a_layout_the_family_does_not_write_is_refused_naming_the_key(arch):
    from trainer_backend.config import TrainConfig
    from trainer_backend.config.rules import problems
    cfg = TrainConfig.model_validate({"model": {"arch": arch}, "output": {"lora_format": "diffusers"}})
    assert any(str(p).startswith("output.lora_format:") for p in problems(cfg))
    with pytest.raises(Exception, match="output.lora_format"):
        get_family(arch).lora_layout(cfg.output.lora_format)
