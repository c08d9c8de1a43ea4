"""`report`: the table from results.jsonl — also from a run cut off mid-way (every finished case
has its line; a killed case's line holds what its steps measured; a case never reached has none).

MFU (model FLOPs utilisation) = it/s × model FLOPs per step ÷ the device's dense bf16 peak. Model
FLOPs per step are those torch's FlopCounterMode counted for one step, taking for each model,
method, resolution, batch and rank the smallest count of any case: the arithmetic the training
needs, so recomputation (gradient checkpointing) or per-step VAE encoding lower a case's MFU instead
of inflating it, and ours and the diffusers example are held to the same FLOPs.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

# Dense bf16 tensor-core peak (no sparsity), TFLOP/s, from the vendors' datasheets; first match wins.
PEAK_BF16_TFLOPS = (
    (r"H100 NVL", 835.0), (r"H100 PCIe", 756.0), (r"GH200|H200", 989.4), (r"H100", 989.4),
    (r"A100", 312.0), (r"L40S", 362.0), (r"RTX 4090", 165.2), (r"\bL4\b", 121.0),
)


def peak_tflops(device_name: str | None) -> float | None:
    for pattern, value in PEAK_BF16_TFLOPS:
        if device_name and re.search(pattern, device_name):
            return value
    return None


def load(path: str | Path) -> list[dict]:
    from .measure import read_jsonl
    path = Path(path)
    return read_jsonl(path / "results.jsonl" if path.is_dir() else path)


def latest_cases(records: list[dict]) -> dict[str, dict]:
    """One line per case, the last one written (a re-run replaces the earlier result), in first-run order."""
    out: dict[str, dict] = {}
    for r in records:
        if r.get("kind") == "case":
            out[r["name"]] = r
    return out


def model_flops(cases: dict[str, dict]) -> dict[str, tuple[int, str]]:
    """flops_key -> (the smallest FLOPs count, the case that counted it)."""
    best: dict[str, tuple[int, str]] = {}
    for name, r in cases.items():
        flops = r.get("flops_per_step")
        if flops and (r["flops_key"] not in best or flops < best[r["flops_key"]][0]):
            best[r["flops_key"]] = (flops, name)
    return best


def reference(name: str, cases: dict[str, dict]) -> str | None:
    """What a case is compared with: ours with the diffusers example at the same setting; one of our
    speed options (an -options group) with the example's same call; else our baseline on the same model."""
    r = cases[name]
    if r["trainer"] == "ours":
        other = f"{r['group']}/diffusers/{r['variant']}"
        if other in cases:
            return other
        if r["group"].endswith("-options"):  # issue 34: each option, and all together, against the example's call
            checkpointing = "precision.gradient_checkpointing=true" in r.get("sets", [])
            example = f"{r['model']}-lora/diffusers/{'gc' if checkpointing else 'baseline'}"
            if example in cases:
                return example
        base = f"{r['model']}-lora/ours/baseline"
        if r["group"] != f"{r['model']}-lora" and r["method"] == "lora" and base in cases:
            return base
    return None


def _fmt(value, digits=2, unit="") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _gib(r: dict):
    return r["peak_allocated"] / 2 ** 30 if r.get("peak_allocated") else None


def planned(r: dict) -> str:
    """The memory planner's peak for the case's config, and its ratio to the measured peak (goal 0.97-1.10:
    bench/planner_vs_measured.py)."""
    if r.get("planned_gib") is None:
        return "n/a"
    gib = _gib(r)
    return f"{r['planned_gib']:.2f}" + (f" ({r['planned_gib'] / gib:.2f})" if gib else "")


def render(records: list[dict], peak_override: float = 0.0) -> str:
    sessions = [r for r in records if r.get("kind") == "session" and "device" in r]
    cases = latest_cases(records)
    if not cases:
        return "no case results yet"
    lines = []
    headers = []  # one line per distinct environment (results of several device calls may be concatenated)
    for s in sessions:
        ex = s.get("examples") or {}
        headers.append(f"device: {s['device']}; torch {s.get('torch')}, diffusers {s.get('diffusers')}, transformers "
                     f"{s.get('transformers')}, peft {s.get('peft')}; examples from diffusers {ex.get('ref', '?')} "
                     f"({str(ex.get('commit', '?'))[:10]}){'; TINY models on the CPU' if s.get('tiny') else ''}")
    lines += list(dict.fromkeys(headers))
    flops = model_flops(cases)
    lines += ["", "| case | status | it/s | × ref | peak GiB | × ref | planned GiB (÷ peak) | GPU busy % | first step s "
                  "| GFLOP/step | MFU | compared with / note |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in cases.items():
        peak = peak_override or peak_tflops(r.get("device"))
        model = flops.get(r.get("flops_key"))
        mfu = r["it_s"] * model[0] / (peak * 1e12) if (peak and model and r.get("it_s")) else None
        ref = reference(name, cases)
        speed_x = mem_x = None
        if ref and r.get("it_s") and cases[ref].get("it_s"):
            speed_x = r["it_s"] / cases[ref]["it_s"]
        if ref and _gib(r) and _gib(cases[ref]):
            mem_x = _gib(r) / _gib(cases[ref])
        notes = [ref] if ref else []
        if r["status"] == "skipped":
            notes.append(r.get("reason", ""))
        elif r["status"] != "ok":
            notes.append(f"{r['status']} after {r.get('steps_done', 0)} steps (rc {r.get('rc')})")
        if "resumed_at" in r:
            notes.append(f"first run exit {r.get('first_run_rc')}, resumed at step {r.get('resumed_at')}, "
                         f"losses finite: {r.get('losses_finite')}")
        if model and model[1] != name and mfu is not None:
            notes.append(f"model FLOPs counted in {model[1]}")
        lines.append(f"| {name} | {r['status']} | {_fmt(r.get('it_s'), 3)} | {_fmt(speed_x, 2, '×')} | "
                     f"{_fmt(_gib(r), 2)} | {_fmt(mem_x, 2, '×')} | {planned(r)} | {_fmt(r.get('gpu_util_median'), 0)} | "
                     f"{_fmt(r.get('first_step_s'), 1)} | "
                     f"{_fmt(r['flops_per_step'] / 1e9 if r.get('flops_per_step') else None, 1)} | "
                     f"{_fmt(mfu * 100 if mfu is not None else None, 1, '%')} | {'; '.join(notes)} |")
    builds = [r for r in records if r.get("kind") == "build"]
    if builds:
        lines.append("")
        lines.append("model builds: " + ", ".join(f"{b['model']} {b['status']} {b['seconds']} s" for b in builds))
    return "\n".join(lines)


def one_line(r: dict) -> str:
    if r["status"] == "skipped":
        return f"{r['name']}: skipped ({r['reason']})"
    gib = _gib(r)
    text = (f"{r['name']}: {r['status']}, {_fmt(r.get('it_s'), 3)} it/s over {r.get('steps_timed', 0)} steps, "
            f"first step at {_fmt(r.get('first_step_s'), 1)} s, peak {_fmt(gib, 2)} GiB, wall {r.get('wall_s')} s")
    if r.get("log_tail"):
        text += "\n    " + r["log_tail"].replace("\n", "\n    ")
    return text


def print_report(args) -> int:
    path = Path(args.path)
    if not path.exists():
        raise SystemExit(f"report: {path} does not exist")
    print(render(load(path), args.peak_tflops))
    if args.json:
        print(json.dumps(latest_cases(load(path)), indent=1))
    return 0


def add_arguments(p) -> None:
    root = Path(__file__).resolve().parents[2]
    p.add_argument("path", nargs="?", default=str(root / ".gpubench" / "results"),
                   help="results.jsonl or the folder holding it (default .gpubench/results)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="the device's dense bf16 peak, if not in the table")
    p.add_argument("--json", action="store_true", help="also print each case's full record")
