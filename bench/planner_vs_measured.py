"""The memory planner's peak next to the peaks measured on a GPU (bench/measured_h100.json).

    python bench/planner_vs_measured.py [--markdown]

Prints one row per measured case: measured GiB, planned GiB, planned/measured, the phase the planner
puts the peak in. Pure: no torch (the planner reads assets/memory_tables.json).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MEASURED = Path(__file__).resolve().parent / "measured_h100.json"


def case_config(case: dict):
    from trainer_backend.config import from_dict
    data = {"model": {"arch": case["arch"]}, "dataset": {"resolution": case["resolution"],
                                                         "cache_text_encoder_outputs": True},
            "network": {"rank": 16, "alpha": 16.0, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"]},
            "precision": {"mixed": "bf16"}, "schedule": {"batch_size": 1}}
    for dotted, value in case["sets"].items():
        section, key = dotted.split(".")
        data.setdefault(section, {})[key] = value
    return from_dict(data)


def rows(measured: dict) -> list[dict]:
    from trainer_backend.launch.memory_plan import plan_memory
    out = []
    for case in measured["cases"]:
        plan = plan_memory(case_config(case))
        out.append({"case": case["name"], "measured": case["peak_gib"], "planned": plan.peak_gib,
                    "ratio": plan.peak_gib / case["peak_gib"], "phase": plan.peak_phase})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="a table for docs/memory.md")
    ap.add_argument("--measured", default=str(MEASURED))
    args = ap.parse_args(argv)
    measured = json.loads(Path(args.measured).read_text())
    table = rows(measured)
    if args.markdown:
        print(f"| case ({measured['device']}) | measured GiB | planned GiB | planned / measured | peak in |")
        print("|---|---:|---:|---:|---|")
        for r in table:
            print(f"| {r['case']} | {r['measured']:.2f} | {r['planned']:.2f} | {r['ratio']:.3f} | {r['phase']} |")
    else:
        print(f"{measured['device']}: {measured['metric']}")
        for r in table:
            print(f"{r['case']:<28} measured {r['measured']:6.2f}  planned {r['planned']:6.2f}  "
                  f"ratio {r['ratio']:.3f}  ({r['phase']})")
    worst = max(abs(r["ratio"] - 1) for r in table)
    print(f"largest deviation: {worst:.1%} (goal: within 10%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
