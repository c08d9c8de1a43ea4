"""The LoRA tools as jobs of the studio's queue (trainer_backend.jobqueue): argv for `python -m trainer_backend
lora <tool> … --job-dir <folder>`, submitted with `submit_command`, and what a job's folder says afterwards
(its report, outputs, error). Stdlib only: the studio's pages and API import it (no torch in the studio).

Job folders: a strength-sampling job lives in the run it draws into (`<run>/jobs/strengths-<time>`), the
other tools in `<runs-dir>/lora-tools/<tool>-<time>`. Each holds console.log, events.jsonl (start, step,
done with the outputs, or error) and, when the tool finished, report.json (what the CLI prints)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..errors import ConfigError

TOOLS = ("merge", "mix", "resize", "extract", "ema", "inspect", "sample")
REPORT_FILE = "report.json"          # lora_tools/cli.py writes it
JOBS_DIR = "jobs"                    # <run>/jobs/: the after-run jobs of one run
TOOLS_DIR = "lora-tools"             # <runs-dir>/lora-tools/: the tools' job folders
DEFAULT_STRENGTHS = "0.5,0.75,1,1.25"


def parse_strengths(text: str) -> list[float]:
    """'0.5,0.75,1,1.25' -> [0.5, 0.75, 1.0, 1.25] (each in [-4, 4], no repeats)."""
    try:
        values = [float(v) for v in str(text).replace(" ", "").split(",") if v]
    except ValueError:
        raise ConfigError(f"--strengths: {text!r}: give numbers separated by commas, e.g. 0.5,0.75,1,1.25") from None
    if not values or any(not -4 <= v <= 4 for v in values) or len(set(values)) != len(values):
        raise ConfigError(f"--strengths: {text!r}: one to many different numbers between -4 and 4")
    return values


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}"


def tool_argv(tool: str, args: list[str], job_dir: Path, python: str = "") -> list[str]:
    if tool not in TOOLS:
        raise ConfigError(f"tool: {tool!r} is not a LoRA tool ({', '.join(TOOLS)})")
    return [python or sys.executable, "-m", "trainer_backend", "lora", tool, *[str(a) for a in args],
            "--job-dir", str(job_dir)]


def sample_args(run_dir: Path, source: str = "", strengths: str = DEFAULT_STRENGTHS,
                prompts: list[str] | tuple = (), base: str = "") -> list[str]:
    """`lora sample` arguments: a source ending in .safetensors is a file (--lora), a folder a checkpoint."""
    args = ["--run", str(Path(run_dir).resolve()), "--strengths", strengths]
    if source:
        args += ["--checkpoint" if Path(source).is_dir() else "--lora", str(Path(source).resolve())]
    for p in prompts:
        args += ["--prompt", p]
    return args + (["--base", base] if base else [])


def queue_sample_job(queue, run_dir: Path, source: str = "", strengths: str = DEFAULT_STRENGTHS,
                     prompts: list[str] | tuple = (), base: str = "", gpus: int = 1, front: bool = False):
    """'Sample this LoRA / checkpoint at these strengths' as a queue job; its images join the run's grid."""
    run_dir = Path(run_dir).resolve()
    parse_strengths(strengths)   # a bad list is refused now, in one line, not by the job later
    if not (run_dir / "config.toml").is_file():
        raise ConfigError(f"run: {run_dir} is not a run folder (no config.toml)")
    stamp = _stamp()
    job_dir = run_dir / JOBS_DIR / f"strengths-{stamp}"
    argv = tool_argv("sample", sample_args(run_dir, source, strengths, prompts, base), job_dir)
    return queue.submit_command(f"{run_dir.name}-strengths-{stamp}", argv, gpus=gpus, front=front, run_dir=job_dir)


def queue_tool_job(queue, tool: str, args: list[str], gpus: int = 1, front: bool = False):
    """merge / mix / resize / extract / ema / inspect as a queue job in <runs-dir>/lora-tools/<tool>-<time>."""
    stamp = _stamp()
    job_dir = Path(queue.runs_dir) / TOOLS_DIR / f"{tool}-{stamp}"
    gpus = 0 if tool == "inspect" else gpus   # reading a header needs no GPU slot
    return queue.submit_command(f"lora-{tool}-{stamp}", tool_argv(tool, args, job_dir), gpus=gpus, front=front,
                                run_dir=job_dir)


def job_result(job_dir: Path) -> dict:
    """{"state": running|done|error|…, "step", "total", "message", "outputs", "report"} from a job folder."""
    from ..jobqueue.progress import run_progress
    job_dir = Path(job_dir)
    prog = run_progress(job_dir)
    out = {"state": prog.get("ending") or ("running" if (job_dir / "events.jsonl").is_file() else "waiting"),
           "step": prog.get("step") or 0, "total": prog.get("total"), "message": prog.get("message") or "",
           "outputs": [], "report": None}
    try:
        out["report"] = json.loads((job_dir / REPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    from ..jobqueue.progress import tail_events
    for ev in tail_events(job_dir):
        if ev.get("event") == "done":
            out["outputs"] = list(ev.get("outputs") or [])
    return out
