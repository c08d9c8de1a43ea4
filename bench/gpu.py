"""One command that measures our trainer against diffusers' example scripts on a GPU (issue 15).

    python bench/gpu.py prepare                      # here: wheels + diffusers example scripts -> .gpubench/bundle
    python bench/gpu.py plan [--cases …] [--part 1/4] [--tiny]   # which cases a call runs, with time estimates
    python3 bench/gpu.py run [--cases …] [--part i/n] [--out DIR] [--budget-s 540]
    python bench/gpu.py run --tiny --device cpu      # the same pipeline end to end on this CPU, tiny models
    python bench/gpu.py report [DIR or results.jsonl]   # the table, also from a cut-off run
    python bench/gpu.py shot DIR/monitor.html --png monitor.png   # the monitor page's screenshot (chromium here)

docs/gpu-bench.md says what is measured, how, and the exact device commands. This entry imports
only the standard library: on the GPU machine `run` starts before the carried wheels are installed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpubench import bundle, cases, monitor, report, runner  # noqa: E402


def shot(args) -> int:
    """The screenshot of a monitor.html that came back from a device without a chromium."""
    if not monitor.screenshot(Path(args.page), Path(args.png)):
        raise SystemExit(f"shot: no chromium here ({', '.join(monitor.CHROMIUMS)}), or it wrote nothing")
    print(f"wrote {args.png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/gpu.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    bundle.add_arguments(sub.add_parser("prepare", help="download wheels, extract the example scripts (dev machine)"))
    cases.add_arguments(sub.add_parser("plan", help="print the cases a run would measure, with estimates"))
    runner.add_arguments(sub.add_parser("run", help="measure the planned cases (GPU machine, or --tiny --device cpu)"))
    report.add_arguments(sub.add_parser("report", help="print the table from results.jsonl (partial files too)"))
    p = sub.add_parser("shot", help="screenshot a monitor.html with chromium (when the device had none)")
    p.add_argument("page")
    p.add_argument("--png", default="monitor.png")
    args = ap.parse_args(argv)
    return {"prepare": bundle.prepare, "plan": cases.print_plan, "run": runner.run,
            "report": report.print_report, "shot": shot}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
