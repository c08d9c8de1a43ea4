"""The studio's GPU monitor during a case: gui/system_monitor.py (what the Run page shows, NVML through
pynvml) sampled in the runner's process while the case trains, its numbers kept in the case's result,
and the monitor's own table from the middle of the run saved as monitor.html (with the utilisation and
memory over time) and, where a chromium is installed, monitor.png: the screenshot.

On a machine without NVIDIA's driver (the CPU check) gpus() is empty: the samples say so and the page
shows the studio's own "No NVIDIA GPU detected" line. Standard library + psutil (gui/system_monitor.py).
"""
from __future__ import annotations

import html
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUMS = ("chromium", "chromium-browser", "google-chrome", "/usr/bin/chromium")


def _system_monitor():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from gui import system_monitor  # no gradio, no torch: psutil and (if present) pynvml
    return system_monitor


class MonitorSampler:
    """gpus() every `interval` seconds on a thread, between start() and stop()."""

    def __init__(self, interval: float = 0.5):
        self.interval, self.samples, self.table = interval, [], ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = 0.0

    def start(self) -> "MonitorSampler":
        self.t0 = time.time()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpubench-monitor")
        self._thread.start()
        return self

    def _run(self) -> None:
        mon = _system_monitor()
        while not self._stop.wait(self.interval):
            infos = mon.gpus()
            self.samples.append({"t": round(time.time() - self.t0, 2),
                                 "gpus": [{"util": g.utilization, "mem_gib": round(g.memory_used_gb, 2),
                                           "total_gib": round(g.memory_total_gb, 1), "name": g.name} for g in infos]})
            if len(self.samples) == 20 or not self.table:  # the studio's table ~10 s into the run
                self.table = mon.gpus_markdown(infos)

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return summary(self.samples)


def summary(samples: list[dict]) -> dict:
    """GPU 0's utilisation (median and max, %) and used memory (max, GiB) over the samples where a
    training step could be running (the second half of the run: loading and caching come first)."""
    first = [s["gpus"][0] for s in samples if s["gpus"]]
    if not first:
        return {"nvml_samples": len(samples), "nvml": "no NVIDIA GPU seen (gui/system_monitor.gpus() empty)"}
    late = first[len(first) // 2:]
    utils = [g["util"] for g in late if g["util"] is not None]
    return {"nvml_samples": len(samples), "gpu_util_median": statistics.median(utils) if utils else None,
            "gpu_util_max": max(utils) if utils else None, "gpu_mem_max_gib": max(g["mem_gib"] for g in first)}


def _svg(samples: list[dict], key: str, top: float, colour: str) -> str:
    points = [(s["t"], s["gpus"][0][key]) for s in samples if s["gpus"] and s["gpus"][0][key] is not None]
    if not points:
        return "<p>(no samples)</p>"
    end = max(t for t, _ in points) or 1.0
    path = " ".join(f"{10 + 780 * t / end:.1f},{150 - 140 * v / (top or 1):.1f}" for t, v in points)
    return (f'<svg width="800" height="160" style="border:1px solid #ccc"><polyline fill="none" stroke="{colour}" '
            f'stroke-width="2" points="{path}"/><text x="12" y="16">{html.escape(key)} (top {top:g})</text>'
            f'<text x="700" y="155">{end:.0f} s</text></svg>')


def markdown_table(text: str) -> str:
    """The studio's markdown (a table, or its one line) as HTML, as the Run page renders it."""
    rows = [r for r in text.splitlines() if r.strip()]
    if not rows or not rows[0].startswith("|"):
        return f"<p>{html.escape(text)}</p>"
    cells = [[html.escape(c.strip()) for c in r.strip("|").split("|")] for r in rows if not set(r) <= set("|-: ")]
    head = "".join(f"<th>{c}</th>" for c in cells[0])
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in cells[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def write_page(out_dir: Path, case: str, table: str, samples: list[dict], stats: dict) -> Path:
    total = max((g["total_gib"] for s in samples for g in s["gpus"][:1]), default=1.0)
    page = out_dir / "monitor.html"
    page.write_text(
        "<html><head><meta charset='utf-8'><style>body{font-family:sans-serif;margin:16px}table{border-collapse:"
        "collapse}td,th{border:1px solid #bbb;padding:4px 10px}</style></head><body>"
        f"<h3>Studio GPU monitor during {html.escape(case)}</h3>{markdown_table(table)}"
        f"<p>{html.escape(str(stats))}</p>{_svg(samples, 'util', 100, '#2a7')}{_svg(samples, 'mem_gib', total, '#27a')}"
        "</body></html>", encoding="utf-8")
    return page


def chromium() -> str | None:
    return next((found for name in CHROMIUMS if (found := shutil.which(name))), None)


def screenshot(page: Path, png: Path, browser: str | None = None) -> bool:
    """chromium --headless --screenshot of the page; False (nothing written) without a chromium."""
    browser = browser or chromium()
    if browser is None:
        return False
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={png}", "--window-size=840,560", page.resolve().as_uri()],
                   capture_output=True, timeout=60, check=False)
    return png.is_file()
