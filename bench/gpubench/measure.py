"""Numbers from one case's step log (observe.py's lines) and run folder. Pure arithmetic on records.

it/s: the median of the step intervals after the warm-up steps (the first step of a run carries
loading, caching and kernel selection; the median ignores a stray slow step, as a checkpoint or a
garbage collection would make). The FLOP-counted step is never timed. Time to first step: from
the process start (the runner's clock) to the end of the first optimizer step. Peak memory: the
process's torch.cuda.max_memory_allocated() at the last timed step.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    """Every complete JSON line (a line cut off by a kill is skipped)."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def case_metrics(records: list[dict], warmup: int, t0: float, batch: int) -> dict:
    steps = [r for r in records if "step" in r]
    out: dict = {"steps_done": len(steps)}
    if not steps:
        return out
    out["first_step_s"] = round(steps[0]["time"] - t0, 2)
    # the interval ending at step s (s > warmup); steps[i] is step i + 1
    intervals = [steps[i]["time"] - steps[i - 1]["time"] for i in range(max(warmup, 1), len(steps))
                 if "flops" not in steps[i] and "profiled" not in steps[i]]
    out["steps_timed"] = len(intervals)
    if intervals:
        median = statistics.median(intervals)
        out.update(step_s=round(median, 5), it_s=round(1.0 / median, 4), samples_s=round(batch / median, 4),
                   step_s_min=round(min(intervals), 5), step_s_max=round(max(intervals), 5))
    timed = [r for r in steps if "flops" not in r and "profiled" not in r]
    if timed and "max_allocated" in timed[-1]:
        out["peak_allocated"] = timed[-1]["max_allocated"]
        out["peak_reserved"] = timed[-1]["max_reserved"]
    counted = [r["flops"] for r in steps if "flops" in r]
    if counted:
        out["flops_per_step"] = counted[-1]
    return out


def resume_facts(run_dir: Path) -> dict:
    """From our run folder's events: where the second run resumed, and whether its losses stayed finite."""
    events = read_jsonl(Path(run_dir) / "events.jsonl")
    resumed = [e for e in events if e.get("event") == "resumed"]
    losses = [e.get("loss") for e in events if e.get("event") == "step"]
    finite = [x for x in losses if isinstance(x, (int, float)) and math.isfinite(x)]
    return {"resumed_at": resumed[-1].get("step") if resumed else None,
            "losses_finite": bool(losses) and len(finite) == len(losses)}
