"""What the Run page shows about one run, computed from its directory: the log tail, the
loss/LR chart data, the progress line, samples, checkpoints and outputs. Pure where possible
(no gradio here) so the same functions serve the Run page, the Runs page and the tests."""
from __future__ import annotations

import html
import re
import time
from pathlib import Path

import pandas as pd

from trainer_backend.run.contract import LOG_FILE, Event

from gui import processes as procs
from gui.run_state import RunStatus, Snapshot

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
LOG_LINES = 1000   # the live log box (Download full log has all): re-sent whenever the log grows
LOG_BYTES = 1_000_000
SMOOTHING = 0.9
CONSOLE_TAIL = 40
CHART_POINTS = 300   # per series: a chart of a long run is thinned to this many points (the newest always kept)


def log_path(run_dir: Path) -> Path | None:
    """The run's log: train.log (the trainer's own, clean log), else console.log (stdout+stderr
    the GUI captured: it alone has messages from before logging started, e.g. a bad config)."""
    for name in (LOG_FILE, procs.CONSOLE_LOG):
        path = Path(run_dir) / name
        if path.is_file() and path.stat().st_size:
            return path
    return None


def clean_log(text: str) -> list[str]:
    """ANSI colours removed; a progress bar redrawn with \\r keeps only its last state."""
    lines = []
    for line in ANSI.sub("", text).split("\n"):
        lines.append(line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r"))
    return lines


LOG_RECORD = re.compile(r"^\d\d:\d\d:\d\d (\w+) ")   # train.log's "%H:%M:%S LEVEL message"


def without_debug(lines: list[str]) -> list[str]:
    """train.log without its DEBUG records (known-harmless library warnings, run/library_noise.py) and
    their continuation lines; Download full log keeps them."""
    kept, hiding = [], False
    for line in lines:
        record = LOG_RECORD.match(line)
        if record:
            hiding = record.group(1) == "DEBUG"
        if not hiding:
            kept.append(line)
    return kept


def log_tail(run_dir: Path, max_lines: int = LOG_LINES, with_console: bool = False) -> str:
    """The last lines of the log; `with_console` appends the end of console.log when the main
    log is train.log (after a crash: tracebacks and warnings that bypassed logging)."""
    path = log_path(run_dir)
    if path is None:
        return ""
    text = _tail_lines(path, max_lines)
    console = Path(run_dir) / procs.CONSOLE_LOG
    if with_console and path.name != procs.CONSOLE_LOG and console.is_file():
        text += f"\n--- end of {procs.CONSOLE_LOG} (stdout/stderr) ---\n" + _tail_lines(console, CONSOLE_TAIL)
    return text


def _tail_lines(path: Path, max_lines: int) -> str:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - LOG_BYTES))
        data = fh.read().decode("utf-8", "replace")
    lines = clean_log(data)
    if size > LOG_BYTES:
        lines = lines[1:]  # the first line was cut in the middle
    if path.name == LOG_FILE:
        lines = without_debug(lines)
    if lines and not lines[-1]:
        lines = lines[:-1]
    return "\n".join(lines[-max_lines:])


def smooth(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """Debiased exponential moving average (TensorBoard's smoothing), NaN-tolerant."""
    out, avg, norm = [], 0.0, 0.0
    for v in values:
        if v is None or v != v:
            out.append(float("nan"))
            continue
        avg = weight * avg + (1 - weight) * v
        norm = weight * norm + (1 - weight)
        out.append(avg / norm)
    return out


def _number(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def thin(n: int, max_points: int = CHART_POINTS) -> list[int]:
    """Indices of at most ~max_points evenly spread points of n, the first and the newest included:
    the browser redraws a chart on every new step, and thousands of points make that slow."""
    if n <= max_points:
        return list(range(n))
    stride = -(-n // max_points)
    keep = list(range(0, n, stride))
    return keep if keep[-1] == n - 1 else [*keep, n - 1]


def loss_frame(snap: Snapshot) -> pd.DataFrame | None:
    """Long-format frame (step, value, series): raw and smoothed training loss, and the
    validation loss where it was computed; None when
    there is no point yet (gradio's LinePlot never draws lines after an empty colour frame)."""
    points = [(s["step"], _number(s.get("loss"))) for s in snap.steps if isinstance(s.get("step"), int)]
    points = [(step, loss) for step, loss in points if loss is not None]
    if not points:
        return None
    smoothed = smooth([p[1] for p in points])      # over every point, then thinned
    keep = thin(len(points))
    steps = [points[i][0] for i in keep]
    raw = [points[i][1] for i in keep]
    smoothed = [smoothed[i] for i in keep]
    val = [(v["step"], _number(v.get("loss"))) for v in snap.validations if isinstance(v.get("step"), int)]
    val = [(step, loss) for step, loss in val if loss is not None]
    val = [val[i] for i in thin(len(val))]
    return pd.DataFrame({"step": steps * 2 + [v[0] for v in val], "value": raw + smoothed + [v[1] for v in val],
                         "series": ["loss"] * len(raw) + ["loss (smoothed)"] * len(raw)
                         + ["validation loss"] * len(val)})


def lr_frame(snap: Snapshot) -> pd.DataFrame | None:
    rows = [(s["step"], _number(s.get("lr"))) for s in snap.steps if isinstance(s.get("step"), int)]
    rows = [(step, lr) for step, lr in rows if lr is not None]
    rows = [rows[i] for i in thin(len(rows))]
    return pd.DataFrame({"step": [r[0] for r in rows], "lr": [r[1] for r in rows]}) if rows else None


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "–"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def progress_numbers(snap: Snapshot, alive: bool, started: float | None, now: float | None = None,
                     exited: float | None = None) -> dict:
    """step/total, epoch, it/s, elapsed and ETA (ETA counts down between step events). Elapsed is the
    run's total: the earlier sessions of a resumed run plus this one (from `started`, its process's
    start, else its first event) up to now, or, once ended, its last event or its process's exit
    (`exited`), whichever is later (so the figure never goes back when the process exits)."""
    now = now or time.time()
    last = snap.last_step
    step, total = last.get("step", 0), last.get("total_steps") or snap.plan.get("total_steps") or 0
    if not total and isinstance(snap.plan.get("multi"), dict):
        total = snap.plan["multi"].get("total_steps", 0)
    session = snap.session_start if snap.session_start is not None else snap.first_time
    start = started if started is not None and started >= snap.earlier_end else session
    end = now if alive else max(snap.last_time or start or 0.0, exited or 0.0)
    eta = _number(last.get("eta_s"))
    if eta is not None and alive and isinstance(last.get("time"), (int, float)):
        eta = max(0.0, eta - (now - last["time"]))
    if not alive:
        eta = None
    compiling = alive and snap.compile.get("status") == "started"  # speed.compile's first step
    return {"step": step, "total": total, "epoch": last.get("epoch"), "it_per_s": _number(last.get("it_per_s")),
            "compiling": compiling,
            "loss": _number(last.get("loss")), "elapsed": (snap.earlier_s + end - start) if start else None, "eta": eta,
            "fraction": min(1.0, step / total) if total else 0.0,
            "download": snap.download if alive and not snap.steps and snap.download.get("status") != "done" else {}}


def _size(n) -> str:
    n = _number(n) or 0.0
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def download_bits(ev: dict) -> tuple[float, list[str]]:
    """A hub download in progress (a `download` event): the bar's fraction and its words."""
    repo = html.escape(str(ev.get("repo", "")))
    if ev.get("status") == "waiting":
        return 0.0, [f"waiting for another process that is downloading <b>{repo}</b>"]
    if ev.get("status") == "planned":
        return 0.0, [f"<b>{repo}</b>: {_size(ev.get('total'))} to download in {ev.get('files_total')} files",
                     f"{_size(ev.get('cached_bytes'))} already cached", f"{_size(ev.get('free_bytes'))} free on disk"]
    done, total = _number(ev.get("bytes")) or 0.0, _number(ev.get("total")) or 0.0
    bits = [f"downloading <b>{repo}</b>: {_size(done)} / {_size(total)}", f"{_size(ev.get('speed'))}/s",
            f"ETA {fmt_duration(_number(ev.get('eta_s')))}",
            f"{html.escape(str(ev.get('file', '')))} ({(ev.get('files_done') or 0) + 1}/{ev.get('files_total') or '?'})"]
    return (min(1.0, done / total) if total else 0.0), bits


def cost_line(elapsed: float | None, eta: float | None, price_per_gpu_hour: float, gpus: int) -> str:
    """'$ so far, $ projected' for a price per GPU-hour (empty when no price is set)."""
    if not price_per_gpu_hour or price_per_gpu_hour <= 0 or elapsed is None:
        return ""
    rate = price_per_gpu_hour * max(1, gpus) / 3600
    text = f"cost ≈ ${elapsed * rate:.2f} so far"
    if eta is not None:
        text += f", ≈ ${(elapsed + eta) * rate:.2f} projected"
    return text


def warnings_html(snap: Snapshot) -> str:
    """The trainer's warnings (the last of each cause), shown above the progress bar: a LoRA that barely
    changes the output must not look like a success."""
    last = {w.get("cause", ""): w for w in snap.warnings}
    return "".join(f'<div class="run-warning" role="alert">⚠ {html.escape(str(w.get("message", "")))}</div>'
                   for w in last.values())


def progress_html(status: RunStatus, numbers: dict, cost: str = "", warnings: str = "") -> str:
    """The status line, the bar and the numbers; `warnings`: warnings_html's boxes."""
    pct = numbers["fraction"] * 100
    bits = [f"step <b>{numbers['step']}</b> / {numbers['total'] or '?'}"]
    if numbers.get("compiling"):
        bits.append("<b>compiling the model</b> (the first step; minutes for a full-size model)")
    if numbers["epoch"] is not None:
        bits.append(f"epoch {numbers['epoch']}")
    if numbers["it_per_s"]:
        bits.append(f"{numbers['it_per_s']:.2f} it/s")
    if numbers["loss"] is not None:
        bits.append(f"loss {numbers['loss']:.4f}")
    bits.append(f"elapsed {fmt_duration(numbers['elapsed'])}")
    if numbers["eta"] is not None:
        bits.append(f"ETA {fmt_duration(numbers['eta'])}")
    if cost:
        bits.append(html.escape(cost))
    if numbers.get("download"):  # before the first step: the base model is still downloading
        pct, bits = download_bits(numbers["download"])
        pct *= 100
    return (f'<div class="run-progress status-{status.status}">{warnings}'
            f'<div class="run-status" id="run-status-text">{html.escape(status.text)}</div>'
            f'<div class="bar"><div class="fill" style="width:{pct:.1f}%"></div></div>'
            f'<div class="numbers">{" · ".join(bits)}</div></div>')


def sample_images(run_dir: Path, snap: Snapshot, limit: int = 48) -> list[tuple[str, str]]:
    """(path, caption) of sample images, newest first; paths in events may be relative to the run."""
    out = []
    for ev in reversed(snap.samples):
        prompts = ev.get("prompts") or []
        for i, p in enumerate(ev.get("paths") or []):
            path = Path(p) if Path(p).is_absolute() else Path(run_dir) / p
            if path.is_file():
                prompt = prompts[i] if i < len(prompts) and len(prompts) == len(ev.get("paths") or []) else ""
                out.append((str(path), f"step {ev.get('step', '?')}: {prompt or path.stem}"))
    return out[:limit]


def _fmt_number(value) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else str(value)


def artifacts_markdown(run_dir: Path, snap: Snapshot) -> str:
    lines = []
    if snap.checkpoints:
        last = snap.checkpoints[-1]
        lines.append(f"**Checkpoints:** {len(snap.checkpoints)} saved, last at step {last.get('step', '?')}: "
                     f"`{last.get('path', '')}`")
    if snap.uploads:
        last = snap.uploads[-1]
        state = last.get("status") or ("ok" if last.get("ok", True) else "failed")
        lines.append(f"**Uploads:** {len(snap.uploads)}, last: {state} `{last.get('url') or last.get('path', '')}`")
    if snap.outputs:
        lines.append("**Outputs:**")
        lines += [f"- `{o}`" for o in snap.outputs]
    effect = snap.adapter_effect
    if effect:
        lines.append(f"**Adapter effect:** mean image difference {_fmt_number(effect.get('adapter_effect'))} with vs "
                     f"without the adapter, weight norm {_fmt_number(effect.get('adapter_norm'))} (step "
                     f"{effect.get('step', '?')})")
    if snap.terminal and snap.terminal.get("event") == Event.ERROR:
        lines.append(f"**Error:** {snap.terminal.get('message', '')}")
    lines.append(f"Run folder: `{Path(run_dir).resolve()}`")
    return "\n\n".join(lines)
