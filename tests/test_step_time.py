"""The step-time estimate (launch/step_time.py): FLOPs counted as an independent count says, the
estimate's monotonic properties, the fit of overhead and efficiency on every measured GPU run (H100, H200)
within the error the module states, the published consumer-card figures within it, and the line the plan
shows."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as hst

from trainer_backend.config import from_dict
from trainer_backend.launch import step_time as st
from trainer_backend.launch.memory_advice import memory_lines, step_time_line
from trainer_backend.launch.memory_plan import plan_memory
from trainer_backend.launch.memory_tables import family_table
from trainer_backend.training import memory_probe as mp

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_flop_count_of_a_linear_toy_equals_two_per_multiply_add(device):
    toy = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16),
                              torch.nn.Linear(16, 8, bias=False)).to(device)
    x = torch.zeros(5, 32, device=device)
    expected = 2 * 5 * (32 * 64 + 64 * 16 + 16 * 8)
    assert mp.count_flops(lambda: toy(x)) == expected


def test_tiny_model_forward_flops_grow_with_pixels_and_batch():
    from trainer_backend.families import load_model, resolve_model_path
    model = load_model(str(resolve_model_path("builtin:tiny-sd1")), arch="sd1")
    small, large = (mp.forward_flops(model, (s, s), 1, "cpu") for s in (32, 64))
    assert 0 < small < large
    assert mp.forward_flops(model, (32, 32), 2, "cpu") == 2 * small


def test_every_bundled_family_has_a_flop_line_or_says_unknown():
    cfg = from_dict({"model": {"arch": "sd1"}})
    for arch in ("sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "zimage", "flux2", "qwen_image", "qwen_image_edit"):
        table = family_table(arch)
        assert table["flops"]["denoiser_forward"][1] > 0, arch
    plan = plan_memory(cfg, "sd1")
    assert step_time_line(cfg, "sd1", plan, card_name="").startswith("Step time ≈")


# counted at 256 and 512 px (1024 and 4096 latent pixels): the properties hold below, between and above
TABLE = {"vae_scale_factor": 8,
         "flops": {"denoiser_forward": [-2e10, 2e8], "vae_encode": [-1e10, 3e8], "sides": [256, 512]}}


def seconds(pixels=4096, batch=1, full=False, gc=False, cached=True, card="RTX 4090"):
    flops = st.step_flops(TABLE, pixels=pixels, batch=batch, full=full, checkpointing=gc, latents_cached=cached)
    return st.seconds(flops, st.CARD_TFLOPS[card])


@pytest.mark.parametrize("pixels", [64, 256, 700, 1024, 4096, 16384])
@pytest.mark.parametrize("batch", [1, 2, 8])
def test_more_work_is_never_faster(pixels, batch):
    base = seconds(pixels, batch)
    assert seconds(pixels * 2, batch) >= base
    assert seconds(pixels, batch + 1) >= base
    assert seconds(pixels, batch, gc=True) > base
    assert seconds(pixels, batch, full=True) > base
    assert seconds(pixels, batch, full=True, gc=True) > seconds(pixels, batch, full=True)
    assert seconds(pixels, batch, cached=False) > base


def test_a_faster_card_is_never_slower():
    cards = sorted(st.CARD_TFLOPS, key=st.CARD_TFLOPS.get)
    times = [seconds(card=c) for c in cards]
    assert times == sorted(times, reverse=True)


def fit_bench():
    import importlib.util
    spec = importlib.util.spec_from_file_location("step_time_fit", ROOT / "bench" / "step_time_fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_constants_are_the_fit_on_every_timed_gpu_run_and_reproduce_them_within_the_stated_error():
    bench = fit_bench()
    cases = bench.fitted(bench.measured_cases())
    assert {c["card"] for c in cases} == {"H100", "H200"} and len(cases) >= 12
    assert any(c["arch"] == "flux" for c in cases)   # a FLOP-bound point beside the overhead-bound ones
    overhead, eff, runs = st.calibrate(family_table, cases)
    assert overhead == pytest.approx(st.OVERHEAD_S, abs=5e-4) and eff == pytest.approx(st.EFFICIENCY, rel=1e-3)
    for name, measured, estimated in runs:
        assert max(measured / estimated, estimated / measured) <= st.FIT_ERROR, (name, measured, estimated)


def test_the_published_consumer_card_figures_are_within_the_stated_error():
    """SimpleTuner's Flux.1 LoRA (nf4) on an RTX 4090: 1.4 s/step at 512², 3.5 s at 1024² (docs/memory.md).
    The old FLOP-only calibration said 16 s at 512²."""
    checks = fit_bench().published_checks()
    assert len(checks) == 2
    for name, published, estimated in checks:
        assert max(published / estimated, estimated / published) <= st.FIT_ERROR, (name, published, estimated)
    assert checks[0][2] < 3 * checks[0][1]


@settings(max_examples=50, deadline=None)
@given(hst.floats(0.0, 2.0), hst.floats(0.01, 0.9),
       hst.lists(hst.floats(1e-4, 50.0), min_size=2, max_size=12, unique=True))
def test_the_fit_recovers_the_overhead_and_efficiency_of_exact_points(overhead, eff, xs):
    got_o, got_e = st.fit([(x, overhead + x / eff) for x in xs])
    assert got_o == pytest.approx(overhead, abs=1e-6 + 1e-6 * max(xs) / eff)
    assert got_e == pytest.approx(eff, rel=1e-5)


@settings(max_examples=50, deadline=None)
@given(hst.lists(hst.tuples(hst.floats(1e-3, 10.0), hst.floats(0.05, 10.0)), min_size=2, max_size=10))
def test_the_fit_never_gives_a_negative_overhead_or_efficiency(points):
    xs = {x for x, _ in points}
    if len(xs) < 2:
        return
    overhead, eff = st.fit(points)
    assert overhead >= 0 and eff > 0


def test_card_names_as_drivers_report_them():
    assert st.card_for("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert st.card_for("NVIDIA GeForce RTX 4060 Ti") == "RTX 4060 Ti"
    assert st.card_for("NVIDIA H100 80GB HBM3") == "H100"
    assert st.card_for("NVIDIA H100 PCIe") == "H100 PCIe" and st.card_for("NVIDIA H100 NVL") == "H100 NVL"
    assert st.card_for("NVIDIA H200") == "H200"
    assert st.card_for("NVIDIA A100-SXM4-80GB") == "A100"
    assert st.card_for("Some Other GPU") is None


def test_the_plan_shows_the_step_time_for_the_named_card_and_the_run_length():
    cfg = from_dict({"model": {"arch": "sdxl"}, "schedule": {"max_steps": 2000}})
    plan = plan_memory(cfg, "sdxl")
    line = step_time_line(cfg, "sdxl", plan, card_name="NVIDIA GeForce RTX 3090")
    assert line.startswith("Step time ≈") and "RTX 3090" in line and "2000 steps ≈" in line
    assert "reference card" not in line
    other = step_time_line(cfg, "sdxl", plan, card_name="Unknown Accelerator")
    assert f"{st.REFERENCE_CARD} (reference card;" in other
    assert any(x.startswith("Step time") for x in memory_lines(cfg, "sdxl", card_gb=24))
    # the CLI passes the step plan's total (epochs × steps per epoch when max_steps is 0)
    shown = [x for x in memory_lines(cfg, "sdxl", card_gb=24, steps=500) if x.startswith("Step time")]
    assert len(shown) == 1 and "500 steps ≈" in shown[0]


def test_a_family_without_a_flop_count_says_unknown(monkeypatch):
    from trainer_backend.launch import memory_advice
    cfg = from_dict({"model": {"arch": "sd1"}})
    plan = plan_memory(cfg, "sd1")
    table = {k: v for k, v in family_table("sd1").items() if k != "flops"}
    from trainer_backend.launch import model_size
    monkeypatch.setattr(model_size, "sized_table", lambda arch, path: table)
    assert step_time_line(cfg, "sd1", plan, card_name="").startswith("Step time: unknown")


def test_durations_read_as_hours_and_minutes():
    assert st.duration(40) == "40 s"
    assert st.duration(12 * 60) == "12 min"
    assert st.duration(70 * 60) == "1 h 10 min"


def test_bundled_sd1_flops_equal_a_fresh_count():
    """assets/memory_tables.json's FLOP line is what tools/make_memory_tables.py --flops-only counts now."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_memory_tables", ROOT / "tools" / "make_memory_tables.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.flops_family("sd1") == family_table("sd1")["flops"]
