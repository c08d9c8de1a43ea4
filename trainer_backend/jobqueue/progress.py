"""What a job's run folder says about it, cheaply: the last step and the ending from the tail of
events.jsonl (a long run's file is megabytes; the queue reads its last 64 KiB)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from trainer_backend.run.contract import EVENTS_FILE, SAVED_STOPS, TERMINAL, Event

TAIL_BYTES = 64 * 1024
_cache: dict[str, tuple[tuple[int, int], dict]] = {}


def tail_events(run_dir: str | Path, tail_bytes: int = TAIL_BYTES) -> list[dict]:
    path = Path(run_dir) / EVENTS_FILE
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - tail_bytes))
            chunk = f.read()
    except OSError:
        return []
    lines = chunk.split(b"\n")
    if size > tail_bytes:
        lines = lines[1:]          # the first line is cut
    events = []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            events.append(ev)
    return events


def run_progress(run_dir: str | Path) -> dict:
    """{step, total, loss, it_per_s, eta_s, ending} where ending is the terminal event kind or None."""
    path = Path(run_dir) / EVENTS_FILE
    try:
        st = path.stat()
        key = (st.st_size, st.st_mtime_ns)
    except OSError:
        return {"step": 0, "total": None, "loss": None, "it_per_s": None, "eta_s": None, "ending": None}
    cached = _cache.get(str(path))
    if cached and cached[0] == key:
        return cached[1]
    out = {"step": 0, "total": None, "loss": None, "it_per_s": None, "eta_s": None, "ending": None,
           "message": ""}
    for ev in tail_events(run_dir):
        kind = ev.get("event")
        if kind == Event.STEP:
            out.update(step=ev.get("step", 0), total=ev.get("total_steps"), loss=ev.get("loss"),
                       it_per_s=ev.get("it_per_s"), eta_s=ev.get("eta_s"))
        elif kind in (Event.START, Event.RESUMED) and ev.get("total_steps"):
            out.update(step=ev.get("step", 0), total=ev.get("total_steps"))
        elif kind in [e.value for e in TERMINAL]:
            out["ending"] = kind
            out["message"] = str(ev.get("message") or "")
            if ev.get("step") is not None:
                out["step"] = ev["step"]
        if kind in (Event.START, Event.RESUMED):
            out["ending"] = None     # a resumed run starts over after an earlier ending
    _cache[str(path)] = (key, out)
    return out


def ending_status(ending: str | None) -> str | None:
    """A terminal event's kind -> the job's final status (None: no ending written)."""
    if ending == Event.DONE:
        return "done"
    if ending in [e.value for e in SAVED_STOPS]:
        return "stopped"
    if ending == Event.ERROR:
        return "error"
    return None
