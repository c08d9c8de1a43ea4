"""How much does the studio add between "Start" and the first training step?

Runs the same config twice: with the CLI (`python -m trainer_backend launch --config X`) and
through a running studio (`python app.py`, Start via its API with gradio_client), and times
from the command/API call to the first `step` event in events.jsonl. Prints both, the
difference (goal: the GUI adds < 2 s) and the GUI process's idle memory.

    .venv/bin/python bench/gui_latency.py [--repeats 2] [--config presets/demo-sd1-lora.toml]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

import psutil
import tomli_w

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def first_step_time(events: Path, deadline: float) -> float:
    """Wall time at which the first `step` event appears (polled every 20 ms)."""
    while time.time() < deadline:
        if events.exists():
            with open(events, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        if json.loads(line).get("event") == "step":
                            return time.time()
                    except ValueError:
                        pass
        time.sleep(0.02)
    raise TimeoutError(f"no step event in {events}")


def stop_run(run_dir: Path) -> None:
    """Kill the measured run's process group (we only needed its first step)."""
    try:
        record = json.loads((run_dir / "process.json").read_text())
        os.killpg(record["pgid"], signal.SIGKILL)
    except (OSError, ValueError, KeyError):
        pass


def config_for(base: dict, runs: Path, name: str) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    data["output"] = {**data.get("output", {}), "dir": str(runs), "name": name}
    return data


def time_cli(base: dict, runs: Path, name: str, timeout: float) -> float:
    cfg_path = runs / f"{name}.toml"
    cfg_path.write_text(tomli_w.dumps(config_for(base, runs, name)))
    t0 = time.time()
    proc = subprocess.Popen([PY, "-m", "trainer_backend", "launch", "--config", str(cfg_path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        return first_step_time(runs / name / "events.jsonl", t0 + timeout) - t0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_gui(runs: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([PY, "app.py", "--port", str(port), "--runs-dir", str(runs),
                             "--presets-dir", str(runs / "presets")], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise TimeoutError("the studio did not start")


def time_gui(client, base: dict, runs: Path, name: str, timeout: float) -> float:
    text = tomli_w.dumps(config_for(base, runs, name))
    t0 = time.time()
    result = client.predict(text, api_name="/start_from_toml")
    if str(result).startswith("error"):
        raise RuntimeError(result)
    try:
        return first_step_time(runs / name / "events.jsonl", t0 + timeout) - t0
    finally:
        stop_run(runs / name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "presets" / "demo-sd1-lora.toml"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    base = tomllib.loads(Path(args.config).read_text())
    from gradio_client import Client

    with tempfile.TemporaryDirectory(prefix="gui-latency-") as tmp:
        runs = Path(tmp)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        gui = start_gui(runs, port)
        try:
            time.sleep(3)  # let start-up work settle before measuring idle memory
            rss = psutil.Process(gui.pid).memory_info().rss / 2**20
            client = Client(f"http://127.0.0.1:{port}/", verbose=False)
            cli_times, gui_times = [], []
            for i in range(args.repeats):   # alternate so drift hits both alike
                cli_times.append(time_cli(base, runs, f"cli-{i}", args.timeout))
                gui_times.append(time_gui(client, base, runs, f"gui-{i}", args.timeout))
        finally:
            gui.send_signal(signal.SIGINT)
            gui.wait(timeout=30)
    cli_s, gui_s = statistics.median(cli_times), statistics.median(gui_times)
    print(f"config: {args.config} ({args.repeats} run(s) each, medians)")
    print(f"CLI  start -> first step: {cli_s:6.2f} s   {['%.2f' % t for t in cli_times]}")
    print(f"GUI  Start -> first step: {gui_s:6.2f} s   {['%.2f' % t for t in gui_times]}")
    print(f"GUI adds: {gui_s - cli_s:+.2f} s (goal < 2 s): {'OK' if gui_s - cli_s < 2 else 'OVER'}")
    print(f"GUI process idle memory (RSS): {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
