"""How fast does the studio's page follow the trainer, and how long does loading a preset block it?

Starts the studio (`app.py`) on a free loopback port and drives Debian's chromium with Playwright:

(a) live view: a fake run folder (the run contract: events.jsonl with a plan and `history` step
    events, train.log, process.json naming a live `sleep` process) is shown on the Run page; the
    script appends one `step` event (and a log line) every `interval` seconds and the page records,
    with a MutationObserver, when its progress line first shows that step. Lag = shown - written.
    Also the bytes the page received per second (Chrome DevTools' Network.dataReceived) and how
    busy the browser's main thread was: CDP Performance's TaskDuration per second, while steps
    arrive and then for `--quiet-s` seconds with no news (the page still ticks: the run is live).
(b) preset load: choose a preset and press Load; time until the form shows its values
    (`output.name`), until the page settles (the command preview names the preset and the form
    stops changing), the Gradio events that fired (POST .../queue/join) and the longest
    main-thread task (PerformanceObserver 'longtask').
(c) field edit: hardware.num_processes set to 2, then back to 1; time until the plan table shows
    it, the events it fired and the main thread's long tasks meanwhile.

`--trees A B` runs the same measurements on several checkouts in turn (interleaved rounds), so
before/after come from one run:

    .venv/bin/python bench/gui_responsiveness.py --trees /path/to/old-checkout .
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CHROMIUM = "/usr/bin/chromium"
PRESET_A, PRESET_B = "demo-sd3-lora", "demo-sd1-lora"   # both valid: the command preview follows

INIT_JS = """
window.__longtasks = [];
try { new PerformanceObserver(l => { for (const e of l.getEntries())
        window.__longtasks.push([performance.timeOrigin + e.startTime, e.duration]); })
      .observe({type: 'longtask', buffered: true}); } catch (e) {}
window.__lastMutation = 0;
window.__seenSteps = {};
new MutationObserver(() => {
  const now = performance.timeOrigin + performance.now();
  const form = document.querySelector('#page-training');
  if (form && form.offsetParent !== null) window.__lastMutation = now;
  const p = document.querySelector('#run-progress');
  const m = p && p.innerText.match(/step (\\d+)/);
  if (m && !(m[1] in window.__seenSteps)) window.__seenSteps[m[1]] = now;
}).observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_studio(tree: Path, runs: Path, presets: Path, log: Path, tries: int = 3) -> tuple[subprocess.Popen, str]:
    """app.py on a free port (retried: under heavy load gradio's own start-up check can time out)."""
    for attempt in range(tries):
        try:
            return _start_studio(tree, runs, presets, log)
        except RuntimeError:
            if attempt == tries - 1:
                raise


def _start_studio(tree: Path, runs: Path, presets: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([PY, "app.py", "--port", str(port), "--runs-dir", str(runs), "--presets-dir",
                             str(presets)], cwd=tree, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("the studio did not start")


def step_event(step: int, total: int) -> dict:
    return {"event": "step", "time": time.time(), "step": step, "total_steps": total, "epoch": 1 + step // 100,
            "samples": step * 2, "loss": 1.0 / (1 + step * 0.01), "lr": 1e-4, "it_per_s": 2.5,
            "eta_s": (total - step) / 2.5}


def fake_run(runs: Path, history: int, total: int) -> tuple[Path, subprocess.Popen]:
    """A run in progress as the trainer leaves it (trainer_backend/run/contract.py)."""
    sys.path.insert(0, str(ROOT))
    from gui.processes import write_process_record
    from trainer_backend.run.contract import EVENTS_FILE, LOG_FILE, RUN_MARKER
    run = runs / "bench-run"
    run.mkdir(parents=True)
    (run / RUN_MARKER).write_text("")
    (run / "config.toml").write_text('version = 1\n[output]\nname = "bench-run"\n')
    events = [{"event": "plan", "time": time.time(), "total_steps": total, "num_processes": 1},
              {"event": "start", "time": time.time(), "step": 0, "total_steps": total, "epoch": 1}]
    events += [step_event(s, total) for s in range(1, history + 1)]
    (run / EVENTS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / LOG_FILE).write_text("".join(f"INFO step {s} loss {1 / (1 + s * .01):.4f} some trainer chatter "
                                        f"{'x' * 40}\n" for s in range(1, history + 1)))
    sleeper = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    write_process_record(run, sleeper.pid, ["accelerate", "launch", "-m", "trainer_backend", "train"])
    return run, sleeper


def measure_live(page, cdp, run: Path, first: int, steps: int, interval: float, total: int,
                 quiet_s: float) -> dict:
    page.get_by_role("tab", name="Run", exact=True).click()
    page.wait_for_function(f"() => /step {first - 1}\\b/.test(document.querySelector('#run-progress')?.innerText)",
                           timeout=120_000)
    time.sleep(2 * interval)
    received = [0]
    busy_from = _task_seconds(cdp)
    cdp.on("Network.dataReceived", lambda e: received.__setitem__(0, received[0] + e.get("dataLength", 0)))
    t_start = time.time()
    written = {}
    for step in range(first, first + steps):
        with open(run / "events.jsonl", "a") as fh:
            fh.write(json.dumps(step_event(step, total)) + "\n")
        with open(run / "train.log", "a") as fh:
            fh.write(f"INFO step {step} loss {1 / (1 + step * .01):.4f}\n")
        written[step] = time.time()
        time.sleep(interval)
    page.wait_for_function(f"() => {first + steps - 1} in window.__seenSteps", timeout=120_000)
    seconds = time.time() - t_start
    busy_live = (_task_seconds(cdp) - busy_from) / seconds
    seen = {int(k): v / 1000 for k, v in page.evaluate("window.__seenSteps").items()}
    lags = []
    for step, t in written.items():
        shown = [v for k, v in seen.items() if k >= step]
        lags.append(min(shown) - t)
    quiet_from, t_quiet = _task_seconds(cdp), time.time()
    time.sleep(quiet_s)
    busy_quiet = (_task_seconds(cdp) - quiet_from) / (time.time() - t_quiet)
    return {"lag_median": statistics.median(lags), "lag_max": max(lags), "kib_per_s": received[0] / 1024 / seconds,
            "busy_live": busy_live, "busy_quiet": busy_quiet}


def _task_seconds(cdp) -> float:
    """The page's main-thread task time so far (CDP Performance.getMetrics' TaskDuration, seconds)."""
    return next(m["value"] for m in cdp.send("Performance.getMetrics")["metrics"] if m["name"] == "TaskDuration")


def choose_preset(page, label: str) -> None:
    page.locator("#preset-select input").first.click()
    page.get_by_role("option", name=label, exact=True).click()
    page.wait_for_function(f"() => document.querySelector('#preset-select input').value === {label!r}")


def measure_preset(page, name: str, joins: list) -> dict:
    choose_preset(page, f"{name} (built-in)")
    time.sleep(3)   # the dropdown's own events settle
    n0 = len(joins)
    t0 = page.evaluate("performance.timeOrigin + performance.now()")
    page.click("#preset-load")
    page.wait_for_function("name => { const e = document.querySelector('#field-output-name input, "
                           "#field-output-name textarea'); return e && e.value === name; }", arg=name,
                           timeout=120_000, polling=20)
    t_values = page.evaluate("performance.timeOrigin + performance.now()")
    page.wait_for_function("name => (document.querySelector('#cmd-shell')?.innerText || '').includes("
                           "'/' + name + '/config.toml')", arg=name, timeout=120_000)
    while True:   # settled: no change to the form for 3 s
        now = page.evaluate("performance.timeOrigin + performance.now()")
        if now - page.evaluate("window.__lastMutation") > 3000:
            break
        time.sleep(0.5)
    t_settled = page.evaluate("window.__lastMutation")
    tasks = [d for start, d in page.evaluate("window.__longtasks") if start >= t0]
    return {"values_s": (t_values - t0) / 1000, "settled_s": (t_settled - t0) / 1000, "events": len(joins) - n0,
            "longest_task_ms": max(tasks, default=0), "blocked_ms": sum(tasks)}


def measure_edit(page, gpus: str, joins: list) -> dict:
    """One field edit (hardware.num_processes on the GPUs tab): until the plan shows it, the events
    it fired and the main thread's long tasks meanwhile."""
    box = page.locator("#field-hardware-num_processes").locator("input").first
    time.sleep(2)
    n0 = len(joins)
    t0 = page.evaluate("performance.timeOrigin + performance.now()")
    box.fill(gpus)
    box.press("Tab")
    page.wait_for_function("n => { const t = document.querySelector('#plan-table')?.innerText || '';"
                           " return n === '1' ? !t.includes('2 GPUs') : t.includes(n + ' GPUs'); }", arg=gpus,
                           timeout=120_000, polling=20)
    t_plan = page.evaluate("performance.timeOrigin + performance.now()")
    time.sleep(2)   # the edit's events end
    tasks = [d for start, d in page.evaluate("window.__longtasks") if start >= t0]
    return {"plan_s": (t_plan - t0) / 1000, "events": len(joins) - n0, "blocked_ms": sum(tasks)}


def run_tree(tree: Path, args, browser) -> dict:
    with tempfile.TemporaryDirectory(prefix="gui-resp-") as tmp:
        tmp = Path(tmp)
        run, sleeper = fake_run(tmp / "runs", args.history, args.history + 1000)
        studio, url = start_studio(tree, tmp / "runs", tmp / "presets", tmp / "app.log")
        # started after the studio: gradio's start-up check times out on a saturated machine
        busy = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.add_init_script(INIT_JS)
            joins = []
            page.on("request", lambda r: joins.append(r.url) if r.method == "POST" and
                    ("queue/join" in r.url or "/run/" in r.url) else None)
            cdp = page.context.new_cdp_session(page)
            cdp.send("Network.enable")
            cdp.send("Performance.enable")
            page.goto(url)
            page.wait_for_selector("#field-model-path", timeout=120_000)
            wait_cmd = "() => (document.querySelector('#cmd-shell')?.innerText || '').includes('demo-sd1-lora')"
            page.wait_for_function(wait_cmd, timeout=120_000)
            time.sleep(3)
            presets = [measure_preset(page, name, joins) for name in [PRESET_A, PRESET_B] * args.repeats]
            page.get_by_role("tab", name="GPUs").click()
            edits = [measure_edit(page, gpus, joins) for gpus in ["2", "1"] * args.repeats]
            live = measure_live(page, cdp, run, args.history + 1, args.steps, args.interval, args.history + 1000,
                                args.quiet_s)
            page.close()
        finally:
            studio.send_signal(signal.SIGINT)
            try:
                studio.wait(timeout=20)
            except subprocess.TimeoutExpired:
                studio.kill()
            sleeper.kill()
            sleeper.wait()
            for b in busy:
                b.kill()
                b.wait()
    return {"live": live, "presets": presets, "edits": edits}


def summary(result: dict) -> str:
    live, presets = result["live"], result["presets"]
    med = {k: statistics.median(p[k] for p in presets) for k in presets[0]}
    worst = {k: max(p[k] for p in presets) for k in presets[0]}
    return (f"  live view lag: median {live['lag_median']:.2f} s, max {live['lag_max']:.2f} s; "
            f"page received {live['kib_per_s']:.0f} KiB/s; browser main thread busy "
            f"{live['busy_live']:.2f} s/s with steps arriving, {live['busy_quiet']:.2f} s/s with no news\n"
            f"  preset load (median | worst of {len(presets)}): values shown {med['values_s']:.2f} | "
            f"{worst['values_s']:.2f} s, settled {med['settled_s']:.2f} | {worst['settled_s']:.2f} s, "
            f"events fired {med['events']:.0f} | {worst['events']:.0f}, longest main-thread task "
            f"{med['longest_task_ms']:.0f} | {worst['longest_task_ms']:.0f} ms, blocked in total "
            f"{med['blocked_ms']:.0f} | {worst['blocked_ms']:.0f} ms\n"
            + edit_summary(result["edits"]))


def edit_summary(edits: list[dict]) -> str:
    med = {k: statistics.median(e[k] for e in edits) for k in edits[0]}
    return (f"  field edit (median of {len(edits)}): plan updated {med['plan_s']:.2f} s, events fired "
            f"{med['events']:.0f}, main thread blocked {med['blocked_ms']:.0f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=[str(ROOT)], help="checkouts to measure (app.py of each)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds over the trees")
    ap.add_argument("--repeats", type=int, default=2, help="preset loads per preset per round")
    ap.add_argument("--history", type=int, default=2000, help="step events already in the run")
    ap.add_argument("--steps", type=int, default=12, help="step events written while measuring")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between written steps")
    ap.add_argument("--quiet-s", type=float, default=20, help="seconds measured after the last step")
    ap.add_argument("--busy", type=int, default=1, help="CPU-bound processes standing in for the trainer")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright
    results: dict[str, list] = {t: [] for t in args.trees}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        for _ in range(args.rounds):
            for tree in args.trees:
                results[tree].append(run_tree(Path(tree).resolve(), args, browser))
                print(f"{tree}:\n{summary(results[tree][-1])}", flush=True)
        browser.close()
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; history {args.history} steps, "
          f"{args.steps} steps written every {args.interval} s, {args.busy} busy process(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
