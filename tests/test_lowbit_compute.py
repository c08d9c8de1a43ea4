"""model.quantize = int8_compute / float8_compute (compute/lowbit_linear.py): the frozen base's Linear layers
multiply in 8 bits (torch._int_mm / torch._scaled_mm) and still pass the gradient to their input, so a LoRA on
them trains; the loss tracks the unquantized run within a stated tolerance, the LoRA file has the same format,
resume is bitwise, and the refused combinations name the key."""
import logging

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run
from test_quantized_base import file_format, losses
from trainer_backend.config import ConfigError, load_config, rules
from trainer_backend.compute import lowbit_linear
from trainer_backend.compute.lowbit_linear import LowBitLinear, kernel_fits

# Per-step loss of an 8-bit-compute run vs the unquantized run (same seed, fp32, 8 steps at lr 1e-2, 32 px):
# within 1 % relative. Seen here (2026-11-28): int8_compute 2.9e-4 (SD1), 3.4e-5 (Flux: its 4 image tokens per
# sample take the dequantized fallback, the text tokens the int8 kernel); float8_compute 1.2e-3 (SD1).
LOSS_RTOL = 0.01
STEPS = ["schedule.max_steps=8", "optimizer.lr=1e-2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("lowbit-data"), n=2, size=32)


@pytest.mark.parametrize("kind, rel", [("int8_compute", 0.02), ("float8_compute", 0.08)])
def test_8bit_layer_matches_the_linear_and_backpropagates_to_its_input(kind, rel):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48).requires_grad_(False)
    layer = LowBitLinear(linear, kind)
    assert layer.qweight.dtype == (torch.int8 if kind == "int8_compute" else torch.float8_e4m3fn)
    assert layer.qweight.shape == (48, 64) and layer.scale.shape == (48, 1)
    assert list(layer.parameters()) == [layer.bias] and not layer.bias.requires_grad
    for rows in (32, 3):   # 32 rows: the 8-bit kernel; 3 rows (int8 needs > 16): the dequantized fallback
        x = torch.randn(2, rows // 2 or 1, 64) if rows == 32 else torch.randn(rows, 64)
        x.requires_grad_(True)
        want = linear(x)
        got = layer(x)
        assert (got - want).norm() <= rel * want.norm()
        (got * torch.arange(48.0)).sum().backward()
        expect_grad = torch.arange(48.0) @ linear.weight
        assert (x.grad - expect_grad).norm() <= rel * expect_grad.norm() * x.shape[:-1].numel() ** 0.5
    # the kernel path quantizes the activations too: it is not the dequantized matmul in disguise
    x = torch.randn(32, 64)
    fits = kernel_fits(kind, 32, 64, 48)
    exact = x @ layer.weight.t() + layer.bias
    assert fits and not torch.equal(layer(x), exact)


def test_a_refused_kernel_falls_back_once_per_shape_with_one_log_line_per_run(monkeypatch, caplog):
    calls = []

    def refuse(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("self.size(0) needs to be greater than 16")
    monkeypatch.setattr(torch, "_int_mm", refuse)
    monkeypatch.setattr(lowbit_linear, "_WARNED", set())
    layer = LowBitLinear(torch.nn.Linear(32, 16).requires_grad_(False), "int8_compute")
    other = LowBitLinear(torch.nn.Linear(32, 16).requires_grad_(False), "int8_compute")
    x = torch.randn(24, 32)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        first, second = layer(x), layer(x)
        other(x)
    assert torch.equal(first, second) and len(calls) == 2   # each layer tries once per shape
    assert torch.allclose(first, x @ layer.weight.t() + layer.bias, atol=1e-6)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "int8_compute" in lines[0] and "24 x 32 x 16" in lines[0]


def test_float8_compute_is_refused_on_a_cuda_card_without_float8_matmuls(monkeypatch):
    monkeypatch.setattr(lowbit_linear, "cuda_capability", lambda device: ((8, 6), "NVIDIA RTX A6000"))
    with pytest.raises(ConfigError, match=r"^model\.quantize: float8_compute .*RTX A6000 has 8\.6"):
        lowbit_linear.check_device("float8_compute", "cuda:0")
    lowbit_linear.check_device("int8_compute", "cuda:0")   # int8 runs everywhere
    monkeypatch.setattr(lowbit_linear, "cuda_capability", lambda device: ((9, 0), "NVIDIA H100"))
    lowbit_linear.check_device("float8_compute", "cuda:0")


@pytest.mark.parametrize("overrides, words", [
    (["network.type=loha", "model.quantize=int8_compute"], "LoRA/DoRA layers only"),
    (["network.type=full", "model.quantize=float8_compute"], "network.type = full"),
])
def test_refused_combinations_name_the_key(overrides, words):
    found = [p for p in rules.problems(load_config(None, overrides)) if p.key == "model.quantize"]
    assert found and words in found[0].message


def test_the_text_encoder_option_keeps_the_storage_kinds_only():
    with pytest.raises(ConfigError, match="model.quantize_text_encoders"):
        load_config(None, ["model.quantize_text_encoders=int8_compute"])
    for allowed in (["model.quantize=int8_compute", "network.dora=true"],
                    ["model.quantize=int8_compute", "memory.block_swap=2"]):   # its int8 buffers move as they are
        assert [p for p in rules.problems(load_config(None, allowed)) if p.key.startswith("model.")] == []


@pytest.mark.parametrize("arch, kind", [("sd1", "int8_compute"), ("flux", "int8_compute"),
                                        pytest.param("sd1", "float8_compute", marks=pytest.mark.slow)])
def test_8bit_compute_lora_tracks_the_unquantized_run_and_saves_the_same_file(tmp_path, tiny_models, data,
                                                                             arch, kind):
    model_dir = tiny_models(arch)
    base, base_events, _ = train_run(tmp_path / "base", model_dir, data, "q", *STEPS)
    run, events, _ = train_run(tmp_path / "q", model_dir, data, "q", *STEPS, f"model.quantize={kind}")
    log = (run / "train.log").read_text()
    assert f"model.quantize = {kind}:" in log and "multiply in 8 bits" in log
    got, ref = losses(events), losses(base_events)
    assert len(got) == len(ref) == 8
    worst = max(abs(q - r) / abs(r) for q, r in zip(got, ref))
    assert worst <= LOSS_RTOL, (worst, got, ref)
    assert got != ref   # the 8-bit path really ran
    assert file_format(run / "q.safetensors") == file_format(base / "q.safetensors")


def test_8bit_compute_resume_is_bitwise(tmp_path, tiny_models, data):
    model_dir = tiny_models("sd1")
    opts = ["model.quantize=int8_compute", "optimizer.lr=1e-2", "checkpoints.every_n_steps=2"]
    straight, _, _ = train_run(tmp_path / "a", model_dir, data, "r", "schedule.max_steps=4", *opts)
    train_run(tmp_path / "b", model_dir, data, "r", "schedule.max_steps=2", *opts)
    resumed, events, _ = train_run(tmp_path / "b", model_dir, data, "r", "schedule.max_steps=4", *opts)
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3, 4]
    a, b = load_file(str(straight / "r.safetensors")), load_file(str(resumed / "r.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_memory_planner_counts_8bit_compute_weights_like_the_storage_kinds():
    from trainer_backend.launch.memory_tables import family_table, weight_bytes
    den = family_table("sdxl")["components"]["unet"]
    weights, rows = den["quantizable"][:2]
    plain = weight_bytes(den, "bf16")
    for kind in ("int8_compute", "float8_compute"):   # a byte per weight and an fp32 scale per row
        assert weight_bytes(den, "bf16", kind) == plain - weights * 2 + weights + rows * 4


def test_dora_reads_the_dequantized_weight_and_trains(tmp_path, tiny_models, data):
    """peft's DoRA takes the norm of its base layer's weight every step: LowBitLinear.weight dequantizes."""
    run, events, _ = train_run(tmp_path, tiny_models("sd1"), data, "d", "schedule.max_steps=2", "optimizer.lr=1e-2",
                               "network.dora=true", "model.quantize=int8_compute")
    got = losses(events)
    assert "multiply in 8 bits" in (run / "train.log").read_text()
    assert len(got) == 2 and all(x == x for x in got)
    assert any(k.endswith("lora_magnitude_vector") or "magnitude" in k for k in load_file(str(run / "d.safetensors")))


def test_a_compiled_8bit_layer_after_a_fused_norm_and_permute_matches_eager():
    """speed.compile with float8_compute: inductor laid the fused GroupNorm + permute + quantize output out
    column-major and the float8 kernel refused it ("mat_a must be row_major", SDXL's proj_in); the layer
    now asks for row-major activations (found by bench/gpu.py's CPU check, case sdxl-options/ours/all-float8)."""
    from trainer_backend.compute.lowbit_linear import LowBitLinear
    torch.manual_seed(0)
    layer, norm = LowBitLinear(torch.nn.Linear(64, 64), "float8_compute"), torch.nn.GroupNorm(8, 64)

    def block(x):
        b, c, h, w = x.shape
        return layer(norm(x).permute(0, 2, 3, 1).reshape(b, h * w, c))

    x = torch.randn(1, 64, 16, 16, requires_grad=True)
    eager = block(x)
    (grad_eager,) = torch.autograd.grad(eager.sum(), x)
    compiled = torch.compile(block)(x)
    (grad_compiled,) = torch.autograd.grad(compiled.sum(), x)
    # a fused norm may round differently, and an activation then lands on the next float8 step: compare
    # against the output's scale (the layer's own test allows 8 % against the plain Linear)
    assert (compiled - eager).abs().max() <= 0.02 * eager.abs().max()
    assert (grad_compiled - grad_eager).abs().max() <= 0.02 * grad_eager.abs().max()
