"""bench/gpu.py's pure parts (well under a second; torch only for the attention switch): the plan
splits into device calls that run every case once, the report reads a results file from a run that
was cut off, and both programs get the same attention kernels."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from gpubench import cases, report  # noqa: E402
from gpubench.measure import case_metrics  # noqa: E402


def test_the_parts_run_every_case_once_in_order_and_balance_the_time():
    chosen = cases.select()
    build_s = {m: spec["build_s"] for m, spec in cases.MODELS.items()}
    for n in range(1, 7):
        parts = cases.split_parts(chosen, n)
        assert len(parts) == n
        assert [c for part in parts for c in part] == chosen
        # no worse than cutting into n runs of equal case counts
        size = -(-len(chosen) // n)
        naive = [chosen[i:i + size] for i in range(0, len(chosen), size)]
        assert max(cases.part_cost(p, build_s) for p in parts) <= max(cases.part_cost(p, build_s) for p in naive)

        class Args:
            cases, tiny = "", False
        for i in range(1, n + 1):
            Args.part = f"{i}/{n}"
            assert cases.planned(Args) == parts[i - 1]


def test_cases_select_groups_and_single_cases():
    names = [c.name for c in cases.select("sd15-lora,flux-lora/ours/gc")]
    assert names == ["sd15-lora/ours/baseline", "sd15-lora/diffusers/baseline", "sd15-lora/ours/gc",
                     "sd15-lora/diffusers/gc", "flux-lora/ours/gc"]
    assert all(c.resolution == cases.TINY_RESOLUTION for c in cases.select("sdxl-lora", is_tiny=True))


def test_step_metrics_skip_the_warmup_and_the_counted_step():
    t0 = 1000.0
    times = [1010.0, 1012.0, 1012.5, 1013.0, 1016.0, 1016.5, 1017.0]  # a 3 s stall at step 5
    steps = [{"step": i + 1, "time": t, "max_allocated": 100 * (i + 1), "max_reserved": 200} for i, t in
             enumerate(times)]
    steps.append({"step": 8, "time": 1030.0, "flops": 7e12, "max_allocated": 10_000, "max_reserved": 200})
    m = case_metrics([{"event": "start", "time": t0}] + steps, warmup=2, t0=t0, batch=2)
    assert m["first_step_s"] == 10.0
    assert m["steps_timed"] == 5          # steps 3..7; the warm-up and the counted step 8 are not timed
    assert m["it_s"] == 2.0 and m["samples_s"] == 4.0   # the median ignores the stall
    assert m["peak_allocated"] == 700     # at the last timed step, not the counted one
    assert m["flops_per_step"] == 7e12


def _case(name, status, **fields):
    group, trainer, variant = name.split("/")
    return {"kind": "case", "name": name, "group": group, "trainer": trainer, "variant": variant, "model": "sdxl",
            "method": "lora", "flops_key": "sdxl:lora:1024:b1:r16", "status": status,
            "device": "NVIDIA H100 80GB HBM3", **fields}


def test_a_cut_off_results_file_reports_what_it_measured(tmp_path):
    lines = [{"kind": "session", "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "diffusers": "0.42.1",
              "examples": {"ref": "v0.40.0", "commit": "d035dcd7cc7c"}},
             _case("sdxl-lora/ours/baseline", "ok", it_s=2.0, peak_allocated=12 * 2 ** 30, first_step_s=40.0,
                   flops_per_step=300e12),
             _case("sdxl-lora/diffusers/baseline", "timeout", it_s=1.6, peak_allocated=15 * 2 ** 30, steps_done=9,
                   rc=None),
             _case("sdxl-options/ours/compile", "skipped", reason="option not in this trainer: precision.compile")]
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"kind": "case", "name": "sdxl-lora/ours/gc", "sta'
    (tmp_path / "results.jsonl").write_text(text)
    table = report.render(report.load(tmp_path))
    rows = {row.split(" | ")[0].strip("| "): row for row in table.splitlines() if row.startswith("| sdxl")}
    assert set(rows) == {"sdxl-lora/ours/baseline", "sdxl-lora/diffusers/baseline", "sdxl-options/ours/compile"}
    ours, theirs = rows["sdxl-lora/ours/baseline"], rows["sdxl-lora/diffusers/baseline"]
    assert f"{2.0 / 1.6:.2f}×" in ours and f"{12 / 15:.2f}×" in ours   # speed and memory against the example
    assert f"{2.0 * 300e12 / 989.4e12 * 100:.1f}%" in ours             # MFU on the H100's dense bf16 peak
    # the killed case keeps its numbers, and its MFU uses the FLOPs the other case counted
    assert "timeout after 9 steps" in theirs and f"{1.6 * 300e12 / 989.4e12 * 100:.1f}%" in theirs
    assert "model FLOPs counted in sdxl-lora/ours/baseline" in theirs
    assert "option not in this trainer: precision.compile" in rows["sdxl-options/ours/compile"]


def test_the_peak_table_knows_the_lent_gpus():
    assert report.peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert report.peak_tflops("NVIDIA H200") == 989.4
    assert report.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert report.peak_tflops("cpu") is None


def test_both_programs_get_the_same_attention_kernels(tmp_path, monkeypatch):
    """--attention no-cudnn (the default) keeps cuDNN's SDPA kernel out of both programs: ours through
    precision.attention, the example through observe.py's switch; pytorch gives both PyTorch's choice."""
    import torch
    from gpubench import commands, observe, runner
    case = next(c for c in cases.catalogue() if c.name == "flux-lora/ours/gc")
    kw = dict(model_dir=tmp_path, images=tmp_path, run_root=tmp_path, run_name="r", steps_log=tmp_path / "s",
              tiny=True, cpu=True)
    assert "precision.attention=sdpa" in commands.ours_argv(case, **kw)
    assert "precision.attention=sdpa_cudnn" in commands.ours_argv(case, attention="pytorch", **kw)
    assert runner.child_env(None, tmp_path, True)["GPUBENCH_SDPA"] == "flash,efficient,math"
    assert runner.child_env(None, tmp_path, True, "pytorch")["GPUBENCH_SDPA"] == ""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert observe.choose_sdpa_backends("flash,efficient,math") == ["flash", "efficient", "math"]
        assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
        assert observe.choose_sdpa_backends("") == [] and not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_a_case_starts_when_most_of_its_estimate_is_left():
    """A case cut at the budget still reports its timed steps (status "timeout"), so one that may not
    finish starts; one that would not reach its timed steps does not."""
    from gpubench.runner import worth_starting
    assert worth_starting(90, 90) and worth_starting(88, 90) and worth_starting(54, 90)
    assert not worth_starting(53, 90) and not worth_starting(0, 90)
