"""The queue under load: 1,000 waiting jobs, the Queue page's refresh and GET /api/v1/jobs, and 50
concurrent clients polling one job's status (p50/p99). Real SQLite, a real headless studio
(`python app.py --headless`) on a loopback port. Prints figures; the goal is < 200 ms for the page
and the listing (docs/queue.md).

    PYTHONPATH=$PWD .venv/bin/python bench/queue_api.py [--jobs 1000] [--clients 50] [--seconds 10]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fill(runs: Path, n: int) -> str:
    """n waiting training jobs (one real config, checked once, stored n times under other names) and a token."""
    from trainer_backend.jobqueue import JobQueue, QueueSettings
    from trainer_backend.jobqueue.tokens import new_token
    queue = JobQueue(QueueSettings(runs_dir=runs))
    queue.set_paused(True)
    toml = (f'[model]\npath = "builtin:tiny-sd1"\n[dataset]\npath = "{ROOT / "assets" / "demo_dataset"}"\n'
            f'resolution = 32\n[output]\nname = "job-0"\n')
    t0 = time.perf_counter()
    first = queue.submit(toml)
    checked = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(1, n):
        queue.store.add("train", f"job-{i}", str(runs / f"job-{i}"), config_toml=first.config_toml, priority=i % 3)
    added = time.perf_counter() - t0
    print(f"submit with the full config check: {checked * 1000:.1f} ms; {n - 1} more rows: "
          f"{added / (n - 1) * 1000:.2f} ms each")
    token = new_token(queue.store, "bench", "read")
    queue.store.close()
    return token


def page_refresh_ms(runs: Path, repeats: int = 20) -> list[float]:
    """The Queue page's refresh (what its timer computes: three tables from one read of the queue)."""
    from gui.queue_page import queue_tables
    from gui.shared_state import Settings, Studio
    from trainer_backend.jobqueue import JobQueue, QueueSettings
    queue = JobQueue(QueueSettings(runs_dir=runs))
    studio = Studio.create(Settings(runs_dir=runs), queue=queue)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        queue_tables(studio)
        times.append((time.perf_counter() - t0) * 1000)
    queue.store.close()
    return times


def get(url: str, token: str) -> tuple[float, int]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return (time.perf_counter() - t0) * 1000, len(body)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="queue-bench-"))
    runs = tmp / "runs"
    token = fill(runs, args.jobs)
    page = page_refresh_ms(runs)
    print(f"Queue page refresh with {args.jobs} waiting jobs: median {statistics.median(page):.1f} ms, "
          f"max {max(page):.1f} ms (server side)")

    port = free_port()
    server = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--headless", "--runs-dir", str(runs),
                               "--port", str(port)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        for _ in range(300):
            try:
                get(base + "/jobs?limit=1", token)
                break
            except OSError:
                time.sleep(0.1)
        listing = [get(base + "/jobs", token) for _ in range(20)]
        ms = [t for t, _ in listing]
        print(f"GET /api/v1/jobs with {args.jobs} jobs ({listing[0][1] // 1024} KiB): median "
              f"{statistics.median(ms):.1f} ms, max {max(ms):.1f} ms")
        one = json.loads(urllib.request.urlopen(urllib.request.Request(
            base + "/jobs?limit=1", headers={"Authorization": f"Bearer {token}"})).read())["jobs"][0]["id"]
        latencies: list[float] = []
        lock = threading.Lock()
        end = time.monotonic() + args.seconds

        def poll():
            mine = []
            while time.monotonic() < end:
                mine.append(get(f"{base}/jobs/{one}", token)[0])
                time.sleep(0.05)
            with lock:
                latencies.extend(mine)
        threads = [threading.Thread(target=poll) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"{args.clients} clients polling GET /api/v1/jobs/{{id}} for {args.seconds:.0f} s: "
              f"{len(latencies)} requests ({len(latencies) / args.seconds:.0f}/s), p50 {pct(latencies, 50):.1f} ms, "
              f"p99 {pct(latencies, 99):.1f} ms, max {max(latencies):.1f} ms")
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
