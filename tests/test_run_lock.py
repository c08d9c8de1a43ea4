"""One trainer per run folder (issue 29 item 19): two `train` commands, the studio and a `train`
command, or two studios on the same output.dir/output.name. The second start is refused with one
line naming the run and who holds it; a holder that crashed leaves a stale lock the next start takes."""
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
from trainer_backend.run import run_lock
from trainer_backend.run.contract import EVENTS_FILE, LOCK_FILE
from trainer_backend.run.run_folder import RunFolderError

ROOT = Path(__file__).resolve().parent.parent
DEMO = {"model": {"path": "builtin:tiny-sd1"}, "dataset": {"path": str(ROOT / "assets" / "demo_dataset"),
                                                           "resolution": 64}}
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
HOLD = """
import sys, time
from trainer_backend.run.run_lock import acquire
lock = acquire(sys.argv[1], by=sys.argv[2])
print("held", flush=True)
time.sleep(120)
"""


def _config(tmp_path: Path, name: str = "shared") -> Path:
    path = tmp_path / f"{name}.toml"
    save_toml(to_dict(from_dict({**DEMO, "output": {"dir": str(tmp_path / "runs"), "name": name},
                                 "schedule": {"max_steps": 400}})), path)
    return path


def _holder_process(run_dir: Path, by: str = "train", **kw) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), by], stdout=subprocess.PIPE, text=True,
                            env=ENV, **kw)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _wait_for_holder(run_dir: Path, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = run_lock.holder(run_dir)
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"nobody took the lock of {run_dir}")


def test_a_second_train_command_is_refused_and_a_killed_holder_leaves_a_stale_lock(tmp_path):
    """Two real `train` commands on one config: the second exits 2 with one line naming the run and
    the first's pid, and writes nothing into the first's folder. SIGKILL the first: the lock is free,
    its record says who died holding it, and the next start takes it over and says so."""
    config = _config(tmp_path)
    run_dir = tmp_path / "runs" / "shared"
    first = subprocess.Popen([sys.executable, "-m", "trainer_backend", "train", "--config", str(config)],
                             env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        held = _wait_for_holder(run_dir)
        assert held["pid"] == first.pid and held["by"] == "train"
        second = subprocess.run([sys.executable, "-m", "trainer_backend", "train", "--config", str(config)],
                                env=ENV, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert "'shared'" in lines[0] and f"pid {first.pid}" in lines[0] and "a `train` command" in lines[0]
        events = run_dir / EVENTS_FILE
        assert not events.exists() or "already being trained" not in events.read_text()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert run_lock.holder(run_dir) is None
    assert run_lock.stale_record(run_dir)["pid"] == first.pid
    third = subprocess.run([sys.executable, "-m", "trainer_backend", "launch", "--dry-run", "--config", str(config)],
                           env=ENV, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    assert f"left locked by a `train` command (pid {first.pid}" in third.stderr
    assert run_lock.holder(run_dir) is None and run_lock.stale_record(run_dir) is None  # released on exit


def test_the_studio_refuses_a_run_held_by_a_train_command_and_writes_nothing(tmp_path):
    from gui.run_control import RunManager, StartRefused
    run_dir = tmp_path / "runs" / "busy"
    holder = _holder_process(run_dir, by="train")
    try:
        before = sorted(p.name for p in run_dir.iterdir())
        cfg = from_dict({**DEMO, "output": {"dir": str(tmp_path / "runs"), "name": "busy"}})
        manager = RunManager(tmp_path / "runs", gpu_count=0)
        with pytest.raises(run_lock.RunLocked, match=rf"'busy'.*a `train` command \(pid {holder.pid} "):
            manager.start(cfg)
        assert sorted(p.name for p in run_dir.iterdir()) == before   # no config.toml, command.txt, console.log
        with pytest.raises(StartRefused, match="being trained by a `train` command"):
            manager.delete(run_dir)
        assert sorted(p.name for p in run_dir.iterdir()) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_studio_start_holds_the_run_until_its_trainer_ends(tmp_path):
    """A real studio Start: the launcher it spawns keeps the lock (the studio may restart meanwhile),
    a `train` command on the same run is refused naming the studio, and the lock goes with the run."""
    from gui.run_control import RunManager
    crashed = _holder_process(tmp_path / "runs" / "studio-run", by="train")   # the last trainer, killed
    crashed.kill()
    crashed.wait()
    manager = RunManager(tmp_path / "runs", gpu_count=0)
    run_dir = manager.start(from_dict({**DEMO, "output": {"dir": str(tmp_path / "runs"), "name": "studio-run"},
                                       "schedule": {"max_steps": 400}}))
    proc = manager.children[run_dir]
    try:
        held = run_lock.holder(run_dir)
        assert held["by"] == "studio" and held["pid"] == proc.pid
        other = subprocess.run([sys.executable, "-m", "trainer_backend", "train", "--config",
                                str(run_dir / "config.toml")], env=ENV, capture_output=True, text=True, timeout=120)
        assert other.returncode == 2 and "'studio-run'" in other.stderr and "the studio" in other.stderr, other.stderr
        console = (run_dir / "console.log").read_text()
        assert f"left locked by a `train` command (pid {crashed.pid}" in console   # the crash, said once
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 30
    while run_lock.holder(run_dir) is not None and time.time() < deadline:  # ranks die with their group
        time.sleep(0.1)
    assert run_lock.holder(run_dir) is None


def test_a_launcher_hands_its_lock_to_the_child_and_a_clean_exit_releases_it(tmp_path):
    run_dir = tmp_path / "run"
    lock = run_lock.acquire(run_dir, by="queue")
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), "train"], stdout=subprocess.PIPE, text=True,
                             env={**ENV, **lock.child_env()}, pass_fds=lock.pass_fds())
    assert child.stdout.readline().strip() == "held"   # the child went on under its launcher's lock
    lock.handed_to(child.pid)
    assert run_lock.holder(run_dir)["pid"] == child.pid
    with pytest.raises(run_lock.RunLocked, match=rf"the job queue \(pid {child.pid} "):
        run_lock.acquire(run_dir, by="train")
    child.kill()
    child.wait()
    with run_lock.acquire(run_dir, by="train") as again:
        assert again.stale["pid"] == child.pid
    record = json.loads((run_dir / LOCK_FILE).read_text())
    assert record["released"] and run_lock.stale_record(run_dir) is None


def test_a_folder_that_is_not_a_run_is_refused_before_any_lock(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.docx").write_text("x")
    with pytest.raises(RunFolderError, match="not a run folder"):
        run_lock.acquire(tmp_path / "mine", by="train")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["thesis.docx"]
