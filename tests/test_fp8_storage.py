"""model.quantize = float8 with a transformer file read tensor by tensor (Krea 2, Qwen-Image 2.1, Ideogram 4):
the Linear weights the run quantizes arrive in torchao's float8 weight-only storage as the file is read. An
e4m3 weight keeps the file's own bytes and scale (per row, per tensor or none), through the family's name
converter (renames, fused rows split); any other is quantized per row as it arrives, bit for bit what
quantize_ makes of the loaded model. place_denoiser's quantize_module then leaves them as they are; the result
equals the bf16 route's quantized model within e4m3 rounding; the peak while loading is the float8 model the
planner counts plus a tensor, never the bf16 model; a Qwen3-VL text encoder file with
model.quantize_text_encoders = float8 arrives so too; and a LoRA run trains on both."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from test_comfy_files_2026 import _fp8, _save, _text_encoder_file, ideogram  # noqa: F401  (ideogram: fixture)
from trainer_backend.compute.quantize import quantizable_linears, quantize_module
from trainer_backend.families import get_family, load_model

E4M3_ROUNDING = 2 ** -4  # half an e4m3 step (3 mantissa bits), relative to a row's largest weight


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from tests.conftest import make_dataset
    return make_dataset(tmp_path_factory.mktemp("fp8data"), n=2, size=32)


def _fp8_tensor_scale(state: dict) -> dict:
    """ComfyUI's older scaled fp8: one scale per tensor (`scale_weight`)."""
    out = {}
    for k, v in state.items():
        if v.dim() == 2 and k.endswith(".weight"):
            scale = v.abs().amax().clamp_min(1e-12) / 448.0
            out[k] = (v / scale).to(torch.float8_e4m3fn)
            out[k.removesuffix(".weight") + ".scale_weight"] = scale.reshape(())
        else:
            out[k] = v
    return out


def _plain_e4m3(state: dict) -> dict:
    return {k: v.to(torch.float8_e4m3fn) if v.dim() == 2 and k.endswith(".weight") else v for k, v in state.items()}


def _float8_layers(module) -> dict:
    return {n: m.weight for n, m in module.named_modules()
            if isinstance(m, torch.nn.Linear) and type(m.weight).__name__ == "Float8Tensor"}


def _file_rows(path, name: str, chunk: int | None = None):
    """A weight's e4m3 bytes and per-row scale as the file holds them (a third of a fused qkv's rows)."""
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        q = f.get_tensor(name)
        scale_name = next((name.removesuffix(".weight") + s for s in (".weight_scale", ".scale_weight")
                           if name.removesuffix(".weight") + s in f.keys()), None)
        s = f.get_tensor(scale_name).float() if scale_name else torch.ones(())
    s = s.reshape(-1, 1).expand(q.shape[0], 1)
    if chunk is not None:
        q, s = q.chunk(3)[chunk], s.chunk(3)[chunk]
    return q, s


def _assert_near_bf16_route(stored, bf16_route, keep):
    """Both quantized as place_denoiser does; same layers in float8, dequantized weights within e4m3 rounding."""
    quantize_module(stored, "float8", device="cpu", compute_dtype=torch.bfloat16, keep=keep)
    quantize_module(bf16_route, "float8", device="cpu", compute_dtype=torch.bfloat16, keep=keep)
    a, b = _float8_layers(stored), _float8_layers(bf16_route)
    assert a.keys() == b.keys() and len(a) == len(quantizable_linears(stored, keep))
    for name in a:
        da, db = a[name].dequantize().float(), b[name].dequantize().float()
        assert ((da - db).abs().amax(1) <= E4M3_ROUNDING * db.abs().amax(1) + 1e-8).all(), name
        assert a[name].dtype == torch.bfloat16
    rest = {k: v for k, v in stored.state_dict().items() if k.removesuffix(".weight") not in a}
    assert all(torch.equal(v, bf16_route.state_dict()[k]) for k, v in rest.items())
    return a, b


@pytest.mark.parametrize("layout", ["per_row", "per_tensor", "plain_e4m3"])
def test_an_fp8_ideogram4_file_keeps_its_bytes_in_float8_storage(ideogram, tmp_path, layout):  # noqa: F811
    from trainer_backend.families.ideogram4.original_file import to_original
    model, folder, files = ideogram
    fam = get_family("ideogram4")
    original = {"model.diffusion_model." + k: v for k, v in to_original(model.denoiser.state_dict()).items()}
    write = {"per_row": _fp8, "per_tensor": _fp8_tensor_scale, "plain_e4m3": _plain_e4m3}[layout]
    path = _save(write(original), tmp_path / f"ideogram4_{layout}.safetensors",
                 json.dumps({k: v for k, v in model.denoiser.config.items() if not k.startswith("_")}))
    args = dict(vae=files["vae"], tokenizer=str(folder), text_encoder_files={"text_encoder": files["text_encoder"]})
    stored = load_model(path, frozen_quantize="float8", **args).denoiser
    layers = _float8_layers(stored)
    assert set(layers) == set(quantizable_linears(stored, fam.keep_unquantized))
    for name, weight in layers.items():  # the file's own bytes and scale, the fused qkv split in thirds
        part = ("to_q", "to_k", "to_v").index(name.rsplit(".", 1)[1]) if ".attention.to_" in name \
            and not name.endswith("to_out.0") else None
        file_name = "model.diffusion_model." + (name.rsplit(".", 1)[0] + ".qkv" if part is not None
                                                else name.replace(".to_out.0", ".o")) + ".weight"
        q, s = _file_rows(path, file_name, part)
        assert torch.equal(weight.qdata.view(torch.uint8), q.view(torch.uint8)) and torch.equal(weight.scale, s)
    kept = [n for n, m in stored.named_modules() if isinstance(m, torch.nn.Linear) and n not in layers]
    assert kept and all(stored.get_submodule(n).weight.dtype == torch.bfloat16 for n in kept)
    before = {n: (w.qdata.view(torch.uint8).clone(), w.scale.clone()) for n, w in layers.items()}
    bf16_route = load_model(path, **args).denoiser
    assert not _float8_layers(bf16_route)  # without model.quantize nothing changes
    _assert_near_bf16_route(stored, bf16_route, fam.keep_unquantized)
    after = _float8_layers(stored)  # not quantized again: the file's bytes and scales as they were
    assert all(torch.equal(after[n].qdata.view(torch.uint8), q) and torch.equal(after[n].scale, s)
               for n, (q, s) in before.items())


def test_a_bf16_file_is_quantized_as_it_arrives_bit_for_bit_as_quantize_does(ideogram, tmp_path):  # noqa: F811
    from trainer_backend.families.ideogram4.original_file import to_original
    model, folder, files = ideogram
    keep = get_family("ideogram4").keep_unquantized
    state = {k: v.to(torch.bfloat16) for k, v in to_original(model.denoiser.state_dict()).items()}
    path = _save(state, tmp_path / "ideogram4_bf16.safetensors",
                 json.dumps({k: v for k, v in model.denoiser.config.items() if not k.startswith("_")}))
    args = dict(vae=files["vae"], tokenizer=str(folder), text_encoder_files={"text_encoder": files["text_encoder"]})
    stored, plain = (load_model(path, frozen_quantize=q, **args).denoiser for q in ("float8", "none"))
    for module in (stored, plain):
        quantize_module(module, "float8", device="cpu", compute_dtype=torch.bfloat16, keep=keep)
    a, b = _float8_layers(stored), _float8_layers(plain)
    assert a.keys() == b.keys() and a
    assert all(torch.equal(a[n].qdata.view(torch.uint8), b[n].qdata.view(torch.uint8))
               and torch.equal(a[n].scale, b[n].scale) for n in a)


def _config_json(module) -> str:
    return json.dumps({k: v for k, v in module.config.items() if not k.startswith("_")})


@pytest.mark.parametrize("arch", ["krea2", "qwen_image21"])
def test_krea2_and_qwen_image21_fp8_files_arrive_in_float8_through_diffusers_converters(tiny_models, tmp_path, arch):
    """Krea 2's converter renames every key; Qwen-Image 2.1's splits each fused gate_up in two (rows)."""
    import importlib
    to_original = importlib.import_module(f"trainer_backend.families.{arch}.single_file").to_original
    components = importlib.import_module(f"trainer_backend.families.{arch}.components")
    from trainer_backend.families.component_files import frozen_storage
    from pathlib import Path
    model = load_model(str(tiny_models(arch)))
    keep = get_family(arch).keep_unquantized
    state = {"model.diffusion_model." + k: v for k, v in to_original(model.denoiser.state_dict()).items()}
    path = Path(_save(_fp8(state), tmp_path / f"{arch}_fp8_scaled.safetensors", _config_json(model.denoiser)))
    with frozen_storage("float8", keep):
        stored = components.load_transformer(path)
    layers = _float8_layers(stored)
    assert set(layers) == set(quantizable_linears(stored, keep)) and layers
    if arch == "qwen_image21":
        gate, _ = _file_rows(str(path), "model.diffusion_model.transformer_blocks.0.img_mlp.gate_up.weight")
        first = layers["transformer_blocks.0.img_mlp.gate_layer"]
        assert torch.equal(first.qdata.view(torch.uint8), gate[: first.shape[0]].view(torch.uint8))
    _assert_near_bf16_route(stored, components.load_transformer(path), keep)


MEASURE = r"""
import json, sys
from pathlib import Path
from diffusers import Ideogram4Transformer2DModel
from trainer_backend.families.component_files import frozen_storage, stored_float8, stream_into, weights_on_meta
from trainer_backend.families.ideogram4.original_file import from_original_one
from trainer_backend.compute.quantize import weight_bytes

def anon():  # resident anonymous memory: what the load allocates, not the file's mapped pages
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("RssAnon")).split()[1]) * 1024

with weights_on_meta():
    model = Ideogram4Transformer2DModel.from_config(json.loads(sys.argv[2]))
expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
with frozen_storage(sys.argv[3], json.loads(sys.argv[4])):
    float8 = stored_float8(model)
base = anon()
seen = [base]
stream_into("model.path", Path(sys.argv[1]), model, from_original_one, expected, "x", float8=float8,
            progress=lambda n: seen.append(anon()))
buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # position tables: not in the planner's params
print(json.dumps({"peak": max(seen) - base, "bytes": weight_bytes(model) - buffers, "float8": len(float8)}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_loading_an_fp8_file_into_float8_storage_peaks_at_what_the_planner_counts(tmp_path):
    """A 37 M-parameter scaled-fp8 file with model.quantize = float8: the loaded model's bytes are the planner's
    float8 weights (launch/memory_tables.weight_bytes over memory_probe.component_entry), and the peak while
    loading stays below them plus the largest tensor of the file in fp32: the bf16 model never exists."""
    from diffusers import Ideogram4Transformer2DModel
    from trainer_backend.families.component_files import weights_on_meta
    from trainer_backend.families.ideogram4.original_file import to_original
    from trainer_backend.launch.memory_tables import weight_bytes
    from trainer_backend.training.memory_probe import component_entry
    config = dict(in_channels=32, num_layers=2, attention_head_dim=256, num_attention_heads=4, intermediate_size=4096,
                  llm_features_dim=1024, adaln_dim=256, mrope_section=[40, 44, 44])
    keep = list(get_family("ideogram4").keep_unquantized)
    with weights_on_meta():
        meta = Ideogram4Transformer2DModel.from_config(config)
    state, gen = {}, torch.Generator().manual_seed(0)
    for k, v in to_original(meta.state_dict()).items():
        state.update(_fp8({k: torch.randn(v.shape, generator=gen) * 0.02}))
    largest = max(v.numel() for v in state.values())
    path = _save(state, tmp_path / "fp8_scaled.safetensors", json.dumps(config))
    del state
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", MEASURE, path, json.dumps(config), "float8", json.dumps(keep)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    entry = component_entry(meta, keep)
    assert entry["params"] > 30e6 and got["float8"] == entry["quantizable"][2]
    assert got["bytes"] == weight_bytes(entry, "bf16", "float8")   # what the planner counts
    print("measured", json.dumps(got), "largest tensor", largest, "bf16 model", weight_bytes(entry, "bf16"))
    assert got["peak"] <= got["bytes"] + 4 * largest, (got, largest)
    assert got["peak"] < weight_bytes(entry, "bf16")  # below the bf16 model the previous route held first


def _fp8_text_encoder(te, path) -> str:
    """The Qwen3-VL text encoder as ComfyUI's scaled-fp8 file (its names; Ideogram 4 reads neither the vision
    tower nor the final norm, so the file leaves them out, as the published one may)."""
    from trainer_backend.families.qwen3vl_file import comfy_name
    state = {comfy_name(k): v for k, v in te.state_dict().items()
             if ".visual." not in f".{k}" and not k.endswith("language_model.norm.weight")}
    return _save(_fp8(state), path, te.config.to_json_string())


def test_an_fp8_text_encoder_file_arrives_in_float8_storage_with_quantize_text_encoders(ideogram, tmp_path):  # noqa: F811
    model, folder, files = ideogram
    keep = get_family("ideogram4").keep_unquantized
    path = _fp8_text_encoder(model.text_encoders[0], tmp_path / "qwen3vl_fp8_scaled.safetensors")
    args = dict(vae=files["vae"], tokenizer=str(folder), text_encoder_files={"text_encoder": path})
    stored = load_model(files["transformer"], frozen_quantize_text_encoders="float8", **args).text_encoders[0]
    layers = _float8_layers(stored)
    assert set(layers) == set(quantizable_linears(stored, keep)) and any(".visual." in f".{n}" for n in layers)
    q, s = _file_rows(path, "model.layers.0.self_attn.q_proj.weight")
    first = layers["language_model.layers.0.self_attn.q_proj"]
    assert torch.equal(first.qdata.view(torch.uint8), q.view(torch.uint8)) and torch.equal(first.scale, s)
    # the vision tower the file leaves out: zeros, in float8 storage as well
    assert all(w.dequantize().abs().max() == 0 for n, w in layers.items() if ".visual." in f".{n}")
    bf16_route = load_model(files["transformer"], **args).text_encoders[0]
    assert not _float8_layers(bf16_route)
    a, b = _assert_near_bf16_route(stored, bf16_route, keep)
    vision = [n for n in a if ".visual." in f".{n}"]  # left out: zeros both ways (compute/quantize.zero_rows_kept)
    assert vision and all(a[n].dequantize().abs().max() == 0 == b[n].dequantize().abs().max() for n in vision)


@pytest.mark.parametrize("route", ["quantize_module", "as_it_arrives"])
def test_an_all_zero_row_stays_zero_in_float8(route):
    """torchao gives an all-zero row the scale 0 and stores 0/0: without the repair the layer outputs NaN."""
    from trainer_backend.compute.quantize import float8_from
    weight = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    weight[1] = 0
    layer = torch.nn.Sequential(torch.nn.Linear(8, 4))
    layer[0].weight.data = weight.clone()
    if route == "quantize_module":
        quantize_module(layer, "float8", device="cpu", compute_dtype=torch.bfloat16)
    else:
        layer.to(torch.bfloat16)
        layer[0].weight = torch.nn.Parameter(float8_from(weight, torch.bfloat16), requires_grad=False)
    got = layer[0].weight.dequantize().float()
    assert torch.equal(got[1], torch.zeros(8)) and torch.isfinite(got).all()
    assert ((got - weight).abs().amax(1) <= E4M3_ROUNDING * weight.abs().amax(1)).all()
    out = layer(torch.randn(2, 8, dtype=torch.bfloat16))
    assert torch.isfinite(out).all() and torch.equal(out[:, 1], layer[0].bias.expand(2, 4)[:, 1])


def test_a_lora_run_on_fp8_files_with_model_quantize_float8(ideogram, tmp_path, data):  # noqa: F811
    from method_runs import train_run
    from trainer_backend.families.ideogram4.original_file import to_original
    model, folder, files = ideogram
    original = {"model.diffusion_model." + k: v for k, v in to_original(model.denoiser.state_dict()).items()}
    path = _save(_fp8(original), tmp_path / "ideogram4_fp8_scaled.safetensors", _config_json(model.denoiser))
    te = _fp8_text_encoder(model.text_encoders[0], tmp_path / "qwen3vl_fp8_scaled.safetensors")
    run, events, _ = train_run(tmp_path, path, data, "fp8", "model.quantize=float8", f"model.vae={files['vae']}",
                               "model.quantize_text_encoders=float8", f"model.text_encoder={te}",
                               f"model.tokenizer={folder}",
                               "schedule.max_steps=2")  # fp32 compute: the bf16-made float8 layers follow it
    log = (run / "train.log").read_text()
    keep = get_family("ideogram4").keep_unquantized
    layers = len(quantizable_linears(model.denoiser, keep))
    assert f"model.quantize = float8: {layers} linear layers" in log
    assert f"; {layers} arrived stored so from the model file" in log
    te_layers = len(quantizable_linears(model.text_encoders[0], keep))
    assert f"model.quantize_text_encoders = float8: {te_layers} linear layers" in log
    assert f"; {te_layers} arrived stored so from the model file" in log
    assert len([e for e in events if e["event"] == "step"]) == 2 and (run / "fp8.safetensors").is_file()


def test_a_block_scaled_fp8_file_is_refused_in_one_line(ideogram, tmp_path):  # noqa: F811
    from trainer_backend.errors import ConfigError
    from trainer_backend.families.ideogram4.original_file import to_original
    model, folder, files = ideogram
    state = _fp8(to_original(model.denoiser.state_dict()))
    name = "layers.0.feed_forward.w1.weight"
    state[name.removesuffix(".weight") + ".weight_scale"] = torch.ones(2, 2)  # 2 x 2 blocks, not rows
    path = _save(state, tmp_path / "blocks.safetensors", _config_json(model.denoiser))
    with pytest.raises(ConfigError, match=r"^model.path: blocks.safetensors scales layers.0.feed_forward.w1.weight by "
                                          r"blocks \(layers.0.feed_forward.w1.weight_scale is \[2, 2\]\); only fp8 "
                                          r"files scaled per tensor or per row are read$"):
        load_model(path, vae=files["vae"], tokenizer=str(folder), text_encoder_files={"text_encoder": files["text_encoder"]},
                   frozen_quantize="float8")
