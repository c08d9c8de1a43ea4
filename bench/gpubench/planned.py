"""The memory planner's peak for a training config, as one JSON line (bench/gpu.py's planner column).

    python planned.py [--config PRESET] --set section.key=value ...

Run by the runner in the cases' environment (it needs pydantic, carried as a wheel); pure (no torch):
the planner reads assets/memory_tables.json and the model folder's configs. Prints
{"planned_gib": float | null, "phase": str, "why": str}; null when the family has no table or the
model folder is outside it (the tiny models).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args(argv)
    from trainer_backend.config import load_config
    from trainer_backend.config.caching import with_auto_caching
    from trainer_backend.launch.memory_plan import plan_memory
    cfg = with_auto_caching(load_config(args.config, args.overrides))  # what the trainer plans with
    plan = plan_memory(cfg)
    out = {"planned_gib": None, "phase": "", "why": "no memory table for this model"}
    if plan is not None:
        out = {"planned_gib": round(plan.peak_gib, 3), "phase": plan.peak_phase, "why": ""}
    print("PLANNED " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
