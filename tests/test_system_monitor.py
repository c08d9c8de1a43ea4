"""The Run page's system line reads the real CPU load from the first draw on (psutil's first
cpu_percent call says 0.0, and calls close together measure nothing)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import re, sys
from gui.system_monitor import system_markdown
values = [float(re.search(r"\\*\\*CPU\\*\\* ([0-9.]+) %", system_markdown(sys.argv[1])).group(1)) for _ in range(3)]
print(values)
"""


def test_cpu_load_shows_on_the_first_draw(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])   # a training run's load
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True,
                             cwd=ROOT, timeout=120, check=True).stdout
    finally:
        busy.kill()
        busy.wait()
    values = [float(v) for v in re.findall(r"[0-9.]+", out)]
    assert len(values) == 3 and all(v > 0 for v in values), out   # first draw and two quick redraws
