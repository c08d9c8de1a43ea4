"""`python -m trainer_backend lora merge|mix|resize|extract|ema|inspect`: argv in, one JSON report out
(stdout); a refusal is one line on stderr naming the file, key and shapes, exit 2."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from ..errors import ConfigError

from .jobs import REPORT_FILE  # a queue job's report
LAYOUT_HELP = "LoRA key layout to write: auto (the input's, else the family's default), kohya or diffusers"


def add_parser(sub) -> None:
    lora = sub.add_parser("lora", help="LoRA tools: merge, mix, resize, extract, ema, inspect, sample "
                                       "(docs/lora-tools.md)")
    tools = lora.add_subparsers(dest="lora_command", required=True)
    m = tools.add_parser("merge", help="bake LoRAs into the base: a diffusers folder and a single file")
    m.add_argument("--base", required=True, help="base model: diffusers folder, single file or builtin:tiny-<family>")
    m.add_argument("--lora", action="append", required=True, metavar="FILE[:WEIGHT]", help="repeatable")
    m.add_argument("--out", required=True, help="OUT/ (diffusers folder) and OUT.safetensors")
    x = tools.add_parser("mix", help="several LoRAs into one (ranks concatenated, or --rank R by SVD)")
    x.add_argument("loras", nargs="+", metavar="FILE:WEIGHT")
    x.add_argument("--base", required=True, help="the base model the LoRAs are for (every key is checked on it)")
    x.add_argument("--rank", type=int, default=0, help="re-factor to this rank (0 = concatenate, exact)")
    r = tools.add_parser("resize", help="SVD rank reduction: --rank R or --energy F per module")
    r.add_argument("lora", metavar="FILE")
    r.add_argument("--base", required=True)
    group = r.add_mutually_exclusive_group(required=True)
    group.add_argument("--rank", type=int, default=0)
    group.add_argument("--energy", type=float, default=0.0, help="keep this fraction of Σσ² per module, e.g. 0.99")
    e = tools.add_parser("extract", help="a LoRA from a full fine-tune (SVD of tuned − base; conv layers as LoCon)")
    e.add_argument("--base", required=True)
    e.add_argument("--tuned", required=True)
    e.add_argument("--rank", type=int, required=True)
    e.add_argument("--conv-rank", type=int, default=0, help="also convolutions (LoCon) at this rank; 0 = none")
    a = tools.add_parser("ema", help="post-hoc EMA over a run's checkpoints (Karras et al. 2024)")
    a.add_argument("--run", required=True, help="the run folder (its config.toml and checkpoints/)")
    a.add_argument("--sigma-rel", required=True, help="one value (0.1), several (0.05,0.1,0.2) or a range "
                                                        "0.05..0.2 (four values)")
    a.add_argument("--base", default="", help="base model (default: the run's model.path)")
    i = tools.add_parser("inspect", help="layout, family, ranks, alphas, size, metadata; --base: does it fit")
    i.add_argument("lora", metavar="FILE")
    i.add_argument("--base", default="")
    s = tools.add_parser("sample", help="draw a run's LoRA (or a checkpoint) at several strengths into its sample grid")
    s.add_argument("--run", required=True, help="the run folder (its config.toml, sample prompts and grid)")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--lora", default="", help="an adapter file for the run's base (default: the run's output)")
    src.add_argument("--checkpoint", default="", help="one of the run's checkpoints/step-… folders")
    s.add_argument("--strengths", default="0.5,0.75,1,1.25", help="comma-separated, e.g. 0,0.5,1")
    s.add_argument("--prompt", action="append", default=[], help="instead of the run's sample prompts (repeatable)")
    s.add_argument("--base", default="", help="base model (default: the run's model.path)")
    for p in (m, x, r, e, a, i, s):
        p.add_argument("--job-dir", default="", help="a queue job's folder: progress events and report.json go there")
    for p in (m, x, r, e, a):
        p.add_argument("--force", action="store_true", help="replace an existing output (never an input)")
    for p in (x, r, e, a):
        p.add_argument("--out", required=True, help="output .safetensors")
    for p in (x, r, e):
        p.add_argument("--layout", default="auto", help=LAYOUT_HELP)


def sigma_values(text: str) -> list[float]:
    """'0.1', '0.05,0.1' or the range '0.05..0.2' (four evenly spaced values)."""
    if ".." in text:
        lo, hi = (float(v) for v in text.split("..", 1))
        return [round(lo + (hi - lo) * k / 3, 6) for k in range(4)]
    return [float(v) for v in text.split(",") if v.strip()]


def run(args) -> int:
    """One tool; with --job-dir also its job's events (start, steps, done with the outputs, or error) and
    report.json in that folder."""
    if not getattr(args, "job_dir", ""):
        return _run(args)
    from ..run.contract import Event
    from ..run.events import RunEvents
    from .files import set_job
    job_dir = Path(args.job_dir)
    events = RunEvents(job_dir, tensorboard=False)
    events.emit(Event.START, step=0)
    set_job(events)
    previous = signal.signal(signal.SIGTERM, _raise_stop)  # the queue's Stop: unwind so partial outputs go
    try:
        code = _run(args, job_dir)
    except ToolStopped:
        events.emit(Event.STOPPED, step=0, message="stopped by the user before it finished; nothing was written")
        code = STOPPED
    finally:
        signal.signal(signal.SIGTERM, previous)
        set_job(None)
        events.close()
    return code


class ToolStopped(BaseException):
    """SIGTERM during a tool job (BaseException: no `except Exception` on the way may swallow it)."""


STOPPED = 75   # as the trainer's stopped exit (run/exitcodes.STOPPED_SAVED): the queue reads the event


def _raise_stop(signum, frame):
    raise ToolStopped()


def _outputs(report: dict) -> list[str]:
    found = [*report.get("outputs", [])]
    found += [report["output"]] if "output" in report else []
    return [o["output"] if isinstance(o, dict) else str(o) for o in found]


def _run(args, job_dir: Path | None = None) -> int:
    from . import tools
    from .files import split_spec
    try:
        c = args.lora_command
        if c == "merge":
            report = tools.merge(args.base, [split_spec(s) for s in args.lora], Path(args.out), args.force)
        elif c == "mix":
            report = tools.mix(args.base, [split_spec(s) for s in args.loras], Path(args.out), args.rank,
                               args.layout, args.force)
        elif c == "resize":
            report = tools.resize(args.base, Path(args.lora), Path(args.out), args.rank, args.energy, args.layout,
                                  args.force)
        elif c == "extract":
            report = tools.extract(args.base, args.tuned, Path(args.out), args.rank, args.conv_rank, args.layout,
                                   args.force)
        elif c == "ema":
            report = tools.post_hoc_ema(Path(args.run), sigma_values(args.sigma_rel), Path(args.out), args.base,
                                        args.force)
        elif c == "sample":
            from .strengths import parse_strengths, sample_strengths
            report = sample_strengths(Path(args.run), Path(args.lora or args.checkpoint) if (args.lora or args.checkpoint)
                                      else None, parse_strengths(args.strengths), args.base, args.prompt)
        else:
            from .inspect_file import inspect
            report = inspect(Path(args.lora), args.base)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        if job_dir:
            _job_event(job_dir, "error", message=str(e).splitlines()[0] if str(e) else type(e).__name__)
        return 2
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if job_dir:
        (job_dir / REPORT_FILE).write_text(text, encoding="utf-8")
        _job_event(job_dir, "done", outputs=_outputs(report))
    return 0


def _job_event(job_dir: Path, kind: str, **fields) -> None:
    from .files import _job
    if _job is not None:
        _job.emit(kind, **fields)
