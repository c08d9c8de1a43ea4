"""Krea 2, Qwen-Image 2.1 and Ideogram 4 from ComfyUI's separate files (diffusion model, Qwen3-VL text
encoder, VAE), written from the tiny models in ComfyUI's key layout: loaded offline weight for weight as
the model they came from; a scaled-fp8 file loads tensor by tensor (bf16, the fp8 values × their scales);
a wrong or missing key is refused in one line naming the option, the file and the key; Ideogram 4's
original transformer layout covers the full-size architecture (458 tensors)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from trainer_backend.errors import ConfigError
from trainer_backend.families import get_family, load_model
from trainer_backend.families.qwen3vl_file import comfy_name

CONFIG = "sd_studio.config"


def _same(a, b, skip=()) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    keys = [k for k in sa if not any(s in k for s in skip)]
    return set(keys) <= sb.keys() and all(torch.equal(sa[k], sb[k]) for k in keys)


def _save(state: dict, path, config: str) -> str:
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata={CONFIG: config})
    return str(path)


def _text_encoder_file(te, path, vision=True, norm=True) -> str:
    """The Qwen3-VL text encoder in ComfyUI's names (model.layers…, visual…)."""
    state = {comfy_name(k): v for k, v in te.state_dict().items()
             if (vision or ".visual." not in f".{k}") and (norm or not k.endswith("language_model.norm.weight"))}
    return _save(state, path, te.config.to_json_string())


def _fp8(state: dict) -> dict:
    """ComfyUI's scaled fp8: each 2-D weight as float8_e4m3fn with a per-row scale beside it."""
    out = {}
    for k, v in state.items():
        if v.dim() == 2 and k.endswith(".weight"):
            scale = v.abs().amax(dim=1).clamp_min(1e-12) / 448.0
            out[k] = (v / scale[:, None]).to(torch.float8_e4m3fn)
            out[k.removesuffix(".weight") + ".weight_scale"] = scale
        else:
            out[k] = v
    return out


@pytest.fixture(scope="module")
def ideogram(tiny_models, tmp_path_factory):
    from trainer_backend.families.flux2.original_keys import vae_to_original
    from trainer_backend.families.ideogram4.original_file import to_original
    folder = tiny_models("ideogram4")
    model = load_model(str(folder))
    out = tmp_path_factory.mktemp("ideogram4-files")
    config = json.dumps({k: v for k, v in model.denoiser.config.items() if not k.startswith("_")})
    original = {"model.diffusion_model." + k: v for k, v in to_original(model.denoiser.state_dict()).items()}
    files = {"transformer": _save(original, out / "ideogram4_tiny.safetensors", config),
             "fp8": _save(_fp8(original), out / "ideogram4_tiny_fp8_scaled.safetensors", config),
             "text_encoder": _text_encoder_file(model.text_encoders[0], out / "qwen3vl_tiny.safetensors",
                                                vision=False, norm=False)}
    vae_config = {k: v for k, v in model.vae.config.items() if not k.startswith("_")}
    files["vae"] = _save(vae_to_original(model.vae.state_dict(), vae_config), out / "flux2-vae.safetensors",
                         json.dumps(vae_config))
    return model, folder, files


def test_ideogram4_comfyui_files_load_as_the_model_they_came_from(ideogram):
    model, folder, files = ideogram
    loaded = load_model(files["transformer"], vae=files["vae"], tokenizer=str(folder),
                        text_encoder_files={"text_encoder": files["text_encoder"]})
    fam = get_family("ideogram4")
    assert loaded.family is fam and loaded.denoiser.dtype == torch.float32
    assert _same(model.denoiser, loaded.denoiser) and _same(model.vae, loaded.vae)
    assert _same(model.text_encoders[0], loaded.text_encoders[0], skip=("visual.", "language_model.norm."))
    ids = fam.tokenize(loaded, ["a red square"], 0)
    assert torch.equal(fam.encode_text(loaded, ids)["hidden"], fam.encode_text(model, ids)["hidden"])
    assert fam.unconditional_transformer(loaded) is not None  # from model.tokenizer's folder


def test_ideogram4_scaled_fp8_file_loads_as_bf16_weight_times_scale(ideogram):
    from trainer_backend.families.ideogram4.original_file import load_transformer
    model, _, files = ideogram
    loaded = load_transformer(__import__("pathlib").Path(files["fp8"]))
    assert loaded.dtype == torch.bfloat16
    for k, v in model.denoiser.state_dict().items():
        err = (loaded.state_dict()[k].float() - v).abs().max() / v.abs().max().clamp_min(1e-6)
        assert err < 0.08, k  # e4m3 keeps 3 mantissa bits (+ bf16 rounding)


def test_a_wrong_or_missing_key_is_one_line_naming_option_file_and_key(ideogram, tmp_path):
    from safetensors.torch import load_file
    model, folder, files = ideogram
    state = load_file(files["transformer"])
    meta = json.dumps({k: v for k, v in model.denoiser.config.items() if not k.startswith("_")})
    del state["model.diffusion_model.layers.0.attention.o.weight"]
    bad = _save(state, tmp_path / "truncated.safetensors", meta)
    with pytest.raises(ConfigError) as e:
        load_model(bad, arch="ideogram4", vae=files["vae"], tokenizer=str(folder),
                   text_encoder_files={"text_encoder": files["text_encoder"]})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.path: truncated.safetensors") and "layers.0.attention.to_out.0" in msg
    te = load_file(files["text_encoder"])
    te["model.layers.3.mlp.up_proj.weight"] = te["model.layers.3.mlp.up_proj.weight"][:1]
    bad_te = _save(te, tmp_path / "qwen3vl_bad.safetensors", model.text_encoders[0].config.to_json_string())
    with pytest.raises(ConfigError) as e:
        load_model(files["transformer"], vae=files["vae"], tokenizer=str(folder),
                   text_encoder_files={"text_encoder": bad_te})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.text_encoder: qwen3vl_bad.safetensors")
    assert "language_model.layers.3.mlp.up_proj.weight" in msg


def test_ideogram4_original_layout_is_the_published_one_at_full_size():
    from trainer_backend.families.ideogram4.original_file import from_original, to_original
    fam = get_family("ideogram4")
    meta = fam.meta_denoiser().state_dict()
    original = to_original(meta)
    assert len(original) == 458  # 16 outside the blocks + 34 x 13, as the published file's layout
    assert tuple(original["layers.0.attention.qkv.weight"].shape) == (3 * 4608, 4608)
    assert {k: tuple(v.shape) for k, v in from_original(original).items()} == {k: tuple(v.shape) for k, v in meta.items()}


def _config_json(module) -> str:
    return json.dumps({k: v for k, v in module.config.items() if not k.startswith("_")})


@pytest.mark.parametrize("variant", ["krea2", "krea2-turbo"])
def test_krea2_comfyui_files_load_as_the_model_they_came_from(tiny_models, tmp_path, variant):
    from trainer_backend.families.krea2.family import options_of
    from trainer_backend.families.krea2.single_file import to_original
    folder = tiny_models(variant)
    model = load_model(str(folder))
    original = {"model.diffusion_model." + k: v for k, v in to_original(model.denoiser.state_dict()).items()}
    transformer = _save(_fp8(original), tmp_path / f"{variant}_tiny_fp8_scaled.safetensors", _config_json(model.denoiser))
    te = _text_encoder_file(model.text_encoders[0], tmp_path / "qwen3vl_4b_tiny.safetensors", vision=False)
    vae = _save(model.vae.state_dict(), tmp_path / "qwen_image_vae.safetensors", _config_json(model.vae))
    fam = get_family("krea2")
    loaded = load_model(transformer, vae=vae, tokenizer=str(folder), text_encoder_files={"text_encoder": te})
    assert loaded.family is fam and loaded.denoiser.dtype == torch.bfloat16  # fp8 -> bf16, never all fp32
    assert _same(model.vae, loaded.vae) and _same(model.text_encoders[0], loaded.text_encoders[0], skip=("visual.",))
    for k, v in model.denoiser.state_dict().items():
        got = loaded.denoiser.state_dict()[k].float()
        assert (got - v).abs().max() <= 0.08 * v.abs().max().clamp_min(1e-6), k
    assert options_of(loaded) == options_of(model) and fam.distilled(loaded) == (variant == "krea2-turbo")
    assert fam.select_layers(loaded) == fam.select_layers(model)
    # without the folder's model_index.json: Turbo from the file's name, bf16 file exactly as the model
    exact = _save(original, tmp_path / "krea2_raw_tiny.safetensors", _config_json(model.denoiser))
    alone = load_model(exact, vae=vae, tokenizer=str(folder / "tokenizer"), text_encoder_files={"text_encoder": te})
    assert _same(model.denoiser, alone.denoiser) and not fam.distilled(alone)
    # ComfyUI's fp8 text encoders load the same way (bf16, weight x scale)
    te_fp8 = _save(_fp8({comfy_name(k): v for k, v in model.text_encoders[0].state_dict().items() if "visual." not in k}),
                   tmp_path / "qwen3vl_4b_fp8_scaled.safetensors", model.text_encoders[0].config.to_json_string())
    encoder = load_model(exact, vae=vae, tokenizer=str(folder), text_encoder_files={"text_encoder": te_fp8}).text_encoders[0]
    assert encoder.dtype == torch.bfloat16
    for k, v in model.text_encoders[0].state_dict().items():
        if "visual." not in k:
            assert (encoder.state_dict()[k].float() - v).abs().max() <= 0.08 * v.abs().max().clamp_min(1e-6), k


def test_qwen_image21_comfyui_files_load_as_the_model_they_came_from(tiny_models, tmp_path):
    from trainer_backend.families.qwen_image21.single_file import to_original
    folder = tiny_models("qwen_image21")
    model = load_model(str(folder))
    transformer = _save({"model.diffusion_model." + k: v for k, v in to_original(model.denoiser.state_dict()).items()},
                        tmp_path / "qwen_image_2.1_tiny.safetensors", _config_json(model.denoiser))
    te = _text_encoder_file(model.text_encoders[0], tmp_path / "qwen3vl_8b_tiny.safetensors")
    vae = _save(model.vae.state_dict(), tmp_path / "qwen_image21_vae.safetensors", _config_json(model.vae))
    fam = get_family("qwen_image21")
    loaded = load_model(transformer, vae=vae, tokenizer=str(folder), text_encoder_files={"text_encoder": te})
    assert loaded.family is fam
    assert _same(model.denoiser, loaded.denoiser) and _same(model.vae, loaded.vae)
    assert _same(model.text_encoders[0], loaded.text_encoders[0], skip=("lm_head",))
    with pytest.raises(ConfigError, match=r"^model.text_encoder: qwen3vl_novision.safetensors is not a Qwen3-VL .* "
                                          r"it has no model.visual\."):
        load_model(transformer, vae=vae, tokenizer=str(folder), text_encoder_files={
            "text_encoder": _text_encoder_file(model.text_encoders[0], tmp_path / "qwen3vl_novision.safetensors",
                                               vision=False)})


def test_ideogram4_full_fine_tune_single_file_is_the_original_layout_and_loads_back(ideogram, tmp_path):
    from safetensors import safe_open
    model, folder, files = ideogram
    fam = get_family("ideogram4")
    single = fam.export_single_file(model, tmp_path / "ideogram4-ft.safetensors", None, {})
    with safe_open(str(single), framework="pt") as f:
        names = set(f.keys())
    assert "layers.0.attention.qkv.weight" in names and "layers.0.attention.o.weight" in names
    assert not any(".to_q." in n or ".to_out." in n for n in names)
    assert _same(model.denoiser, fam.load_denoiser_file(single, like=model.denoiser))
    again = load_model(str(single), vae=files["vae"], tokenizer=str(folder),
                       text_encoder_files={"text_encoder": files["text_encoder"]})  # as ComfyUI users would
    assert again.family is fam and _same(model.denoiser, again.denoiser)


MEASURE = r"""
import json, sys
from pathlib import Path
from diffusers import Ideogram4Transformer2DModel
from trainer_backend.families.component_files import stream_into, weights_on_meta
from trainer_backend.families.ideogram4.original_file import from_original_one

def anon():  # resident anonymous memory: what the load allocates, not the file's mapped pages
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("RssAnon")).split()[1]) * 1024

with weights_on_meta():
    model = Ideogram4Transformer2DModel.from_config(json.loads(sys.argv[2]))
expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
base = anon()
seen = [base]
stream_into("model.path", Path(sys.argv[1]), model, from_original_one, expected, "x", progress=lambda n: seen.append(anon()))
params = list(model.parameters())
print(json.dumps({"peak": max(seen) - base, "params": sum(p.numel() for p in params),
                  "bytes": sum(p.numel() * p.element_size() for p in params),
                  "dtypes": sorted({str(p.dtype) for p in params})}))
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_a_scaled_fp8_file_loads_without_expanding_the_model_to_fp32(tmp_path):
    """Peak memory while loading a 37 M-parameter fp8 file stays far below the model in fp32 (what reading
    the whole file and dequantizing it did), and the loaded model is what the planner counts for it."""
    import os
    import subprocess
    import sys
    from diffusers import Ideogram4Transformer2DModel
    from trainer_backend.families.component_files import weights_on_meta
    from trainer_backend.families.ideogram4.original_file import to_original
    from trainer_backend.launch.memory_tables import weight_bytes
    config = dict(in_channels=32, num_layers=2, attention_head_dim=256, num_attention_heads=4, intermediate_size=4096,
                  llm_features_dim=1024, adaln_dim=256, mrope_section=[40, 44, 44])
    with weights_on_meta():
        meta = Ideogram4Transformer2DModel.from_config(config)
    state = {}
    gen = torch.Generator().manual_seed(0)
    for k, v in to_original(meta.state_dict()).items():
        state.update(_fp8({k: torch.randn(v.shape, generator=gen) * 0.02}))
    path = _save(state, tmp_path / "fp8_scaled.safetensors", json.dumps(config))
    # every large allocation its own mapping, returned when freed: RssAnon then counts live tensors only
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", MEASURE, path, json.dumps(config)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    fp32 = got["params"] * 4
    assert got["params"] > 30e6 and got["dtypes"] == ["torch.bfloat16"]
    assert got["bytes"] == weight_bytes({"params": got["params"]}, "bf16")  # the planner's frozen bf16 denoiser
    assert got["peak"] < 0.7 * fp32, (got["peak"], fp32)  # bf16 weights (0.5) + at most a tensor in flight
