"""Z-Image LoRA files in each layout: the key sets of the full-size architecture (meta device), the
tiny file loading in diffusers with the trained model's output, the "original" layout merged into the
original checkpoint the way ComfyUI applies it, and the "kohya" layout named as musubi-tuner (kohya's
Z-Image trainer) names its modules."""
from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

from lora_checks import adapted_modules, model_of
from trainer_backend.families import get_family, load_model
from trainer_backend.families.kohya_fused import merge_into_original
from trainer_backend.families.zimage.kohya_lora import to_kohya_zimage, to_peft_updates
from trainer_backend.families.zimage.single_file import from_original, to_original

ZIMAGE = get_family("zimage")
BLOCKS = 30 + 2 + 2  # main layers, noise refiners, context refiners of the published 6B model



def test_full_size_original_layout_is_what_diffusers_converter_reads():
    denoiser = ZIMAGE.meta_denoiser()
    state = denoiser.state_dict()
    original = to_original(state)
    assert len(state) == 521 and len(original) == 453  # q, k, v fused in each of the 34 blocks
    assert "layers.29.attention.qkv.weight" in original and "x_embedder.weight" in original
    back = from_original(original)  # diffusers' own single-file converter
    assert back.keys() == state.keys() and all(back[k].shape == state[k].shape for k in state)


@pytest.mark.parametrize("layout", ["diffusers", "kohya", "original"])
def test_full_size_lora_keys_of_each_layout(layout):
    denoiser = ZIMAGE.meta_denoiser()
    denoiser.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=list(ZIMAGE.default_targets)))
    adapted = adapted_modules(denoiser)
    assert len(adapted) == BLOCKS * 7
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}
    written = ZIMAGE.lora_file_state(model_of(ZIMAGE, denoiser), {"transformer": state}, 2.0, layout)
    # diffusers' own loader puts both layouts on exactly the adapted modules
    assert ZIMAGE.diffusers_lora_targets(written, denoiser) == adapted
    if layout == "diffusers":  # ComfyUI's Z-Image key map reads these names (transformer.<diffusers path>)
        assert all(k.startswith("transformer.") and k.endswith((".lora_A.weight", ".lora_B.weight")) for k in written)
        return
    if layout == "kohya":  # musubi-tuner's: lora_unet_ + its module path (= diffusers') with _, one per module
        names = {k.split(".")[0] for k in written}
        assert names == {"lora_unet_" + m.replace(".", "_") for m in adapted}
        assert "lora_unet_layers_29_attention_to_q" in names and "lora_unet_layers_0_attention_to_out_0" in names
        assert "lora_unet_noise_refiner_1_feed_forward_w3" in names and not any("qkv" in n for n in names)
        # musubi-tuner loads the adapters inside ZImageTransformerBlock modules: all of them here
        assert all(n.startswith(("lora_unet_layers_", "lora_unet_noise_refiner_", "lora_unet_context_refiner_"))
                   for n in names)
        assert all(float(written[f"{n}.alpha"]) == 2.0 for n in names)
        assert set(to_peft_updates(written, denoiser)) == adapted
        return
    # original: every name is lora_unet_ + an original-layout Linear weight (ComfyUI's key map), shapes fit
    original = to_original({k.replace(".base_layer", ""): v for k, v in denoiser.state_dict().items()
                            if "lora_" not in k})
    by_name = {k[: -len(".weight")].replace(".", "_"): v.shape for k, v in original.items()
               if k.endswith(".weight") and v.dim() == 2}
    names = {k.split(".")[0] for k in written}
    assert len(names) == BLOCKS * 5  # qkv (fused), out, w1, w2, w3 per block
    for n in names:
        shape = by_name[n[len("lora_unet_"):]]
        assert written[f"{n}.lora_up.weight"].shape[0] == shape[0]
        assert written[f"{n}.lora_down.weight"].shape[1] == shape[1]
        assert float(written[f"{n}.alpha"]) == (6.0 if n.endswith("_qkv") else 2.0)  # alpha/rank kept
    assert "lora_unet_layers_29_attention_qkv" in names and "lora_unet_noise_refiner_1_feed_forward_w3" in names
    assert set(to_peft_updates(written, denoiser)) == adapted


@pytest.fixture(scope="module")
def trained(tiny_models):
    """The tiny model with random adapters (what training leaves: non-zero lora_B), alpha ≠ rank."""
    model = load_model(str(tiny_models("zimage")))
    model.denoiser.add_adapter(LoraConfig(r=4, lora_alpha=2, target_modules=list(ZIMAGE.default_targets)))
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=g) * 0.2 for k, v in get_peft_model_state_dict(model.denoiser).items()}
    set_peft_model_state_dict(model.denoiser, state)
    return model, state


def _probe(denoiser) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = [torch.randn(16, 1, 8, 8, generator=g) for _ in range(2)]
    caps = [torch.randn(7, 32, generator=g), torch.randn(11, 32, generator=g)]
    with torch.no_grad():
        out = denoiser(x, torch.tensor([0.3, 0.8]), caps, return_dict=False)[0]
    return torch.stack(out)


@pytest.mark.parametrize("layout", ["diffusers", "kohya", "original"])
def test_tiny_lora_file_loads_in_diffusers_and_matches_the_trained_model(trained, tiny_models, tmp_path, layout):
    from diffusers import ZImagePipeline
    from safetensors.torch import save_file
    model, state = trained
    want = _probe(model.denoiser)
    written = ZIMAGE.lora_file_state(model, {"transformer": state}, 2.0, layout)
    path = tmp_path / "zimage-lora.safetensors"
    save_file(written, str(path))
    pipe = ZImagePipeline.from_pretrained(str(tiny_models("zimage")), local_files_only=True)
    base = _probe(pipe.transformer)
    pipe.load_lora_weights(str(path))
    got = _probe(pipe.transformer)
    assert (got - base).abs().max() > 1e-2, "the LoRA did not change the output"
    assert (got - want).abs().max() <= 1e-5


def test_original_layout_file_merged_as_comfyui_does_matches_the_trained_model(trained):
    """ComfyUI applies an original-layout file by adding alpha/rank · up @ down to each named weight of the
    original checkpoint: merged, the original file gives the trained model's output."""
    import copy
    model, state = trained
    want = _probe(model.denoiser)
    written = ZIMAGE.lora_file_state(model, {"transformer": state}, 2.0, "original")
    base = copy.deepcopy(model.denoiser)
    base.disable_adapters()
    plain = {k.replace(".base_layer", ""): v for k, v in base.state_dict().items() if "lora_" not in k}
    merged = from_original(merge_into_original(to_original(plain), written))
    fresh = type(base).from_config(base.config)
    fresh.load_state_dict(merged)
    assert (_probe(fresh) - want).abs().max() <= 1e-5
    # and the file reads back (network.network_weights) onto the trained modules with their update
    for module, (down, up, scale) in to_peft_updates(written, model.denoiser).items():
        a, b = state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"]
        assert torch.allclose(scale * up @ down, 0.5 * b @ a, atol=1e-6), module


@pytest.mark.parametrize("layout", ["original", "kohya"])
def test_a_run_starts_from_a_kohya_style_file(trained, tiny_models, tmp_path, layout):
    """network.network_weights = an original-layout file (fused qkv) or musubi-tuner's: the run's adapters
    start from it, so after one step at a negligible learning rate the output file applies the same update."""
    from safetensors.torch import load_file, save_file
    from conftest import make_dataset
    from method_runs import train_run
    model, state = trained  # rank 4, alpha 2
    path = tmp_path / "start.safetensors"
    save_file(ZIMAGE.lora_file_state(model, {"transformer": state}, 2.0, layout), str(path))
    data = make_dataset(tmp_path / "data", n=1, size=32)
    run, _, _ = train_run(tmp_path, tiny_models("zimage"), data, "resumed-from-kohya", f"network.network_weights={path}",
                          "network.alpha=2", "network.target_modules=[\"to_q\",\"to_k\",\"to_v\",\"to_out.0\",\"w1\",\"w2\",\"w3\"]",
                          "schedule.max_steps=1", "optimizer.name=sgd", "optimizer.lr=1e-12")
    out = load_file(str(run / "resumed-from-kohya.safetensors"))  # diffusers layout: alpha/rank folded into B
    modules = {k[len("transformer."): -len(".lora_A.weight")] for k in out if k.endswith(".lora_A.weight")}
    assert len(modules) == 4 * 7
    for m in modules:
        got = out[f"transformer.{m}.lora_B.weight"] @ out[f"transformer.{m}.lora_A.weight"]
        want = 0.5 * state[f"{m}.lora_B.weight"] @ state[f"{m}.lora_A.weight"]
        assert torch.allclose(got, want, atol=1e-5), m
