"""Run state from the run directory: events -> status, re-attaching to a live process after a
GUI restart, marking a dead one interrupted, refusing a second Start, signalling the ranks."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer_backend.config import from_dict, save_toml, to_dict

from gui import processes as procs
from gui.run_control import RunManager, StartRefused
from gui.run_monitor import clean_log, log_tail, loss_frame, progress_numbers, smooth
from gui.run_state import EventTail, derive_status, fold_events, run_status

ROOT = Path(__file__).resolve().parent.parent
DEMO = {"model": {"path": "builtin:tiny-sd1"}, "dataset": {"path": str(ROOT / "assets" / "demo_dataset"),
                                                           "resolution": 64}}


def ev(kind, **fields):
    return {"event": kind, "time": fields.pop("time", time.time()), **fields}


def steps(n, start=1, total=10):
    return [ev("step", step=i, total_steps=total, epoch=1, loss=1.0 / i, lr=1e-4, it_per_s=2.0, eta_s=5.0)
            for i in range(start, start + n)]


@pytest.fixture()
def sleeper():
    """A real process in its own session, like the trainer the GUI starts."""
    procs_started = []

    def start(seconds=60):
        p = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], start_new_session=True)
        procs_started.append(p)
        return p
    yield start
    for p in procs_started:
        if p.poll() is None:
            p.kill()
        p.wait()


def make_run(root: Path, name: str, events: list[dict] = (), hardware: dict | None = None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    data = to_dict(from_dict({**DEMO, "output": {"dir": str(root), "name": name}, "hardware": hardware or {}}))
    save_toml(data, run / "config.toml")
    with open(run / "events.jsonl", "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    return run


def test_status_follows_the_events():
    s = lambda events, **kw: derive_status(fold_events(events), kw.get("alive", False), kw.get("code"), None,
                                           kw.get("ckpt", False))
    assert s([]).status == "new"
    assert s([ev("plan", num_processes=1)], alive=True).status == "starting"
    assert s([ev("plan"), *steps(3)], alive=True).status == "running"
    stopped = s([ev("plan"), *steps(3), ev("stopped", step=3)])
    assert stopped.status == "stopped" and stopped.resumable and "state saved" in stopped.text
    assert s([ev("plan"), *steps(3), ev("preempted", step=3)]).resumable
    done = s([ev("plan"), *steps(10), ev("done", outputs=["a.safetensors"])])
    assert done.status == "done" and not done.resumable
    err = s([ev("plan"), *steps(2), ev("error", message="CUDA out of memory")])
    assert err.status == "error" and "out of memory" in err.text
    dead = s([ev("plan"), *steps(3)])
    assert dead.status == "interrupted" and dead.resumable and "no checkpoint" in dead.text
    assert "last checkpoint" in s([ev("plan"), *steps(3)], ckpt=True).text
    # a resume (new plan event) clears the old ending; the chart restarts at the resumed step
    snap = fold_events([ev("plan"), *steps(5), ev("stopped"), ev("plan"), *steps(3, start=4)])
    assert snap.terminal is None and [x["step"] for x in snap.steps] == [1, 2, 3, 4, 5, 6]
    assert derive_status(snap, True, None, None, True).status == "running"
    # bad config: exit 2 before any event; the trainer's one line is shown
    assert "model.path" in derive_status(fold_events([]), False, 2, None, False,
                                         error_line="model.path: x does not exist").text


def test_event_tail_reads_only_complete_new_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(ev("plan")) + "\n" + json.dumps(steps(1)[0])[:20])
    tail = EventTail(path)
    assert len(tail.refresh().steps) == 0 and tail.snapshot.plan == {}
    with open(path, "w") as fh:
        fh.write(json.dumps(ev("plan", total_steps=10)) + "\n")
        fh.write(json.dumps(steps(1)[0]) + "\n")
    assert tail.refresh().plan.get("total_steps") == 10   # rewritten file: read again from the start
    with open(path, "a") as fh:
        fh.write(json.dumps(steps(1, start=2)[0]) + "\n")
    assert [s["step"] for s in tail.refresh().steps] == [1, 2]


def test_reattach_to_a_live_run_and_mark_a_dead_one_interrupted(tmp_path, sleeper):
    run = make_run(tmp_path, "live", [ev("plan"), *steps(2)])
    proc = sleeper()
    procs.write_process_record(run, proc.pid, ["python", "-m", "trainer_backend", "train"])
    # a "restarted GUI": a new manager knows nothing but the folder
    manager = RunManager(tmp_path)
    assert manager.live_runs() == [run]
    assert run_status(run).status == "running"
    assert manager.current_run() == run
    proc.kill()
    proc.wait()
    state = run_status(run)
    assert state.status == "interrupted" and state.resumable and not state.alive
    assert RunManager(tmp_path).live_runs() == []


def test_recycled_pid_or_other_host_is_not_taken_for_the_run(tmp_path, sleeper):
    run = make_run(tmp_path, "r", [ev("plan"), *steps(1)])
    proc = sleeper()
    record = procs.write_process_record(run, proc.pid, ["x"])
    assert procs.is_alive(record)
    assert not procs.is_alive({**record, "started": record["started"] - 3600})
    assert not procs.is_alive({**record, "host": "another-machine"})


def test_second_start_on_the_same_devices_is_refused(tmp_path, sleeper):
    busy = make_run(tmp_path, "busy", [ev("plan"), *steps(2)])
    proc = sleeper()
    procs.write_process_record(busy, proc.pid, ["python", "-m", "trainer_backend", "train"])
    manager = RunManager(tmp_path, gpu_count=0)
    cfg = from_dict({**DEMO, "output": {"dir": str(tmp_path), "name": "second"}})
    with pytest.raises(StartRefused, match="busy"):
        manager.start(cfg)
    assert not (tmp_path / "second").exists()


def test_start_refuses_to_overwrite_a_stopped_or_finished_run(tmp_path):
    make_run(tmp_path, "paused", [ev("plan"), *steps(3), ev("stopped", step=3)])
    make_run(tmp_path, "finished", [ev("plan"), *steps(3), ev("done", outputs=[])])
    manager = RunManager(tmp_path)
    with pytest.raises(StartRefused, match="Resume"):
        manager.start(from_dict({**DEMO, "output": {"dir": str(tmp_path), "name": "paused"}}))
    with pytest.raises(StartRefused, match="finished"):
        manager.start(from_dict({**DEMO, "output": {"dir": str(tmp_path), "name": "finished"}}))


def test_device_sets():
    from gui.run_control import device_set, devices_overlap
    assert devices_overlap(device_set({"gpu_ids": "0,1"}, 4), device_set({"gpu_ids": "1"}, 4))
    assert not devices_overlap(device_set({"gpu_ids": "0"}, 4), device_set({"gpu_ids": "1,2"}, 4))
    assert devices_overlap(device_set({"gpu_ids": "all"}, 4), device_set({"gpu_ids": "3"}, 4))
    assert devices_overlap(device_set({"gpu_ids": "0"}, 0), device_set({"cpu": True}, 4))
    assert not devices_overlap(device_set({"cpu": True}, 2), device_set({"gpu_ids": "0"}, 2))


def test_stop_signals_the_ranks_not_the_launcher():
    tree = [(10, 1, ["python", "-m", "trainer_backend.launch.accelerate_launch", "--num_processes", "2", "-m", "trainer_backend",
                     "train", "--config", "c.toml"]),
            (11, 10, ["python", "-u", "-m", "trainer_backend", "train", "--config", "c.toml"]),
            (12, 10, ["python", "-u", "-m", "trainer_backend", "train", "--config", "c.toml"]),
            (13, 11, ["python", "-u", "-m", "trainer_backend", "train", "--config", "c.toml"]),  # forked worker
            (14, 11, ["python", "-c", "from multiprocessing.spawn import spawn_main"])]
    assert procs.select_trainer_pids(tree) == [11, 12]
    assert procs.select_trainer_pids([(20, 1, ["python", "-m", "trainer_backend", "train"])]) == [20]


def test_stop_of_a_live_process_sends_sigterm_and_marks_the_stop(tmp_path):
    run = make_run(tmp_path, "s", [ev("plan"), *steps(1)])
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (open(sys.argv[1], 'w').write('term'), sys.exit(75)))\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "got")], start_new_session=True)
    try:
        time.sleep(0.5)
        procs.write_process_record(run, proc.pid, ["python", "-c", "..."])
        manager = RunManager(tmp_path, stop_timeout_s=60)
        assert "stopping" in manager.stop(run)
        assert proc.wait(timeout=10) == 75
        assert (tmp_path / "got").read_text() == "term"
        assert (run / "control" / "stop").exists()            # the trainer reports "stopped", not "preempted"
        with pytest.raises(StartRefused):
            manager.kill(run)                                 # not running any more
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_log_is_cleaned_and_loss_is_smoothed(tmp_path):
    assert clean_log("\x1b[32mINFO\x1b[0m ok\nbar 10%\rbar 50%\rbar 90%\nnext") == ["INFO ok", "bar 90%", "next"]
    (tmp_path / "train.log").write_text("".join(f"line {i}\n" for i in range(5000)))
    tail = log_tail(tmp_path, max_lines=100)
    assert tail.splitlines()[0] == "line 4900" and tail.splitlines()[-1] == "line 4999"
    assert smooth([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])
    noisy = [1.0, 3.0] * 20
    assert max(smooth(noisy)[10:]) - min(smooth(noisy)[10:]) < 1.0
    frame = loss_frame(fold_events(steps(4)))
    assert sorted(set(frame["series"])) == ["loss", "loss (smoothed)"] and len(frame) == 8
    assert loss_frame(fold_events([])) is None
    with_val = loss_frame(fold_events([*steps(4), ev("validation", step=4, loss=0.3, best=0.3)]))
    assert with_val[with_val["series"] == "validation loss"]["value"].tolist() == [0.3]


def test_progress_counts_down_the_eta_between_events():
    snap = fold_events([ev("plan"), ev("step", step=5, total_steps=20, epoch=1, loss=0.5, lr=1e-4,
                                      it_per_s=1.0, eta_s=15.0, time=1000.0)])
    numbers = progress_numbers(snap, alive=True, started=990.0, now=1005.0)
    assert numbers["fraction"] == 0.25 and numbers["eta"] == 10.0 and numbers["elapsed"] == 15.0


def test_a_crash_before_any_event_shows_the_exception(tmp_path):
    run = make_run(tmp_path, "crashed")
    (run / "console.log").write_text(
        "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
        "ImportError: cannot import name 'thing' from 'trainer_backend.run.checkpoint_files'\n"
        "Traceback (most recent call last):\n"
        "subprocess.CalledProcessError: Command '[...]' returned non-zero exit status 1.\n")
    procs.write_exit(run, 1)
    state = run_status(run)
    assert state.status == "error" and "ImportError: cannot import name 'thing'" in state.text
    # the log shown for a failed run ends with the console (where the traceback is)
    (run / "train.log").write_text("10:00:00 INFO starting\n")
    assert "ImportError" in log_tail(run, with_console=True)


def test_sample_gallery_follows_sample_events(tmp_path):
    from PIL import Image
    from gui.run_monitor import sample_images
    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True)
    for name in ("a", "b", "c"):
        Image.new("RGB", (8, 8)).save(run / "samples" / f"{name}.png")
    snap = fold_events([ev("sample", step=5, paths=[str(run / "samples" / "a.png")]),
                        ev("sample", step=10, paths=["samples/b.png", "samples/c.png", "samples/missing.png"])])
    images = sample_images(run, snap)
    assert [Path(p).name for p, _ in images] == ["b.png", "c.png", "a.png"]     # newest first
    assert images[0][1].startswith("step 10")


def test_multi_node_preview_lists_every_machine(tmp_path):
    from gui.shared_state import Settings, Studio
    studio = Studio.create(Settings(runs_dir=tmp_path / "runs", presets_dir=tmp_path / "p"))
    cfg = from_dict({**DEMO, "hardware": {"num_machines": 2, "main_process_ip": "10.0.0.1", "num_processes": 2}})
    shell, argv, toml = studio.command_preview(cfg)
    assert "machine_rank 0" in shell and "machine_rank 1" in shell and "10.0.0.1" in shell
    assert json.loads(argv)[-2:-1] == ["--config"] and json.loads(argv)[-1].endswith("my-lora/config.toml")
    assert "[hardware]" in toml and "num_machines = 2" in toml


def test_a_run_killed_with_sigkill_is_interrupted_and_resumable_from_its_checkpoint(tmp_path):
    """The OOM killer or a lost machine: no final event, exit -9. The docs promise
    'interrupted (resumable)', and says where resume continues."""
    run = make_run(tmp_path, "oom", [ev("plan"), *steps(5)])
    (run / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "checkpoints" / "step-00000004" / "manifest.json").write_text("{}")
    manager = RunManager(tmp_path)
    proc = procs.spawn([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), run)
    manager.children[run] = proc
    assert run_status(run).status == "running"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    manager.reap()
    assert procs.read_exit(run) == -9
    state = run_status(run)
    assert state.status == "interrupted" and state.resumable and "error" not in state.text
    assert "SIGKILL" in state.text and "step 4" in state.text
    # a rank killed under accelerate launch: the launcher exits 1 and names the signal
    other = make_run(tmp_path, "oom-rank", [ev("plan"), *steps(2)])
    procs.write_exit(other, 1)
    (other / procs.CONSOLE_LOG).write_text("subprocess.CalledProcessError: died with <Signals.SIGKILL: 9>.\n")
    assert run_status(other).status == "interrupted" and "no checkpoint yet" in run_status(other).text
