"""The memory planner's peak next to the peaks measured on GPUs (bench/measured_h100.json,
bench/measured_h200.json).

    python bench/planner_vs_measured.py [--markdown] [--measured FILE ...]

Prints one row per measured case: measured GiB, planned GiB, planned/measured, the phase the planner
puts the peak in. Each file names its benches' settings ("benches": {name: {"command", "sets"}}) and
each case its own ("sets"): the config is built from exactly those, on the schema's defaults, as the
bench's `--set` overrides built it (paths and output names aside). Pure: no torch (the planner reads
assets/memory_tables.json). The goal: every case within 10%, and never more than about 3% under
(an under-planned config is one the studio says fits and that then runs out of memory).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent
MEASURED = (HERE / "measured_h100.json", HERE / "measured_h200.json")
GOAL = (0.97, 1.10)   # planned / measured


def case_config(case: dict, bench_sets: dict):
    """The config a bench ran for `case`: the bench's settings, then the case's (dotted keys)."""
    from trainer_backend.config import from_dict
    data: dict = {"model": {"arch": case["arch"]}, "dataset": {"resolution": case["resolution"]}}
    for dotted, value in {**bench_sets, **case["sets"]}.items():
        section, key = dotted.split(".")
        data.setdefault(section, {})[key] = value
    return from_dict(data)


def rows(measured: dict) -> list[dict]:
    from trainer_backend.launch.memory_plan import plan_memory
    out = []
    for case in measured["cases"]:
        plan = plan_memory(case_config(case, measured["benches"][case["bench"]]["sets"]))
        out.append({"case": case["name"], "device": measured["device"], "measured": case["peak_gib"],
                    "planned": plan.peak_gib, "ratio": plan.peak_gib / case["peak_gib"], "phase": plan.peak_phase})
    return out


def all_rows(paths=MEASURED) -> list[dict]:
    return [r for path in paths for r in rows(json.loads(Path(path).read_text()))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="a table for docs/memory.md")
    ap.add_argument("--measured", nargs="+", default=[str(p) for p in MEASURED])
    args = ap.parse_args(argv)
    table = all_rows(args.measured)
    if args.markdown:
        print("| GPU | case | measured GiB | planned GiB | planned / measured | peak in |")
        print("|---|---|---:|---:|---:|---|")
        for r in table:
            print(f"| {r['device']} | {r['case']} | {r['measured']:.2f} | {r['planned']:.2f} | {r['ratio']:.3f} "
                  f"| {r['phase']} |")
    else:
        for r in table:
            print(f"{r['device'][:20]:<20} {r['case']:<30} measured {r['measured']:6.2f}  planned {r['planned']:6.2f}"
                  f"  ratio {r['ratio']:.3f}  ({r['phase']})")
    low, high = min(r["ratio"] for r in table), max(r["ratio"] for r in table)
    print(f"planned / measured from {low:.3f} to {high:.3f} (goal: {GOAL[0]} to {GOAL[1]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
