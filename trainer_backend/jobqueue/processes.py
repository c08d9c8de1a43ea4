"""A job as an OS process: start it in its own process group, record it in <run>/process.json
so a restarted studio (page or queue worker) can find it again, and talk to it with signals and
control files (the names in trainer_backend/run/contract.py). The GUI's Run page and the queue's
worker both use these (gui/processes.py re-exports them)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

from trainer_backend.run.contract import CONSOLE_LOG, EXIT_FILE, PROCESS_FILE  # noqa: F401 (the contract's names)
from trainer_backend.run.contract import CONTROL_DIR as CONTROL
from trainer_backend.run.contract import Control

STOP_MARK = Control.STOP.value             # trainer: the stop was the user's ("stopped", not "preempted")
SAVE_MARK = Control.SAVE_NOW.value         # trainer: save a checkpoint at the next step
SAMPLE_MARK = Control.SAMPLE_NOW.value     # trainer: render samples at the next step
STOP_TIME = "stop_requested_at"  # GUI only: when Stop was pressed (drives "stopping…" and the kill timeout)
LAUNCHER_WORDS = ("launch", "torchrun", "torch.distributed.run", "accelerate")


def spawn(argv: list[str], env: dict[str, str], run_dir: Path, cwd: str | Path | None = None,
          pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start the trainer detached from the GUI's process group (so Ctrl-C in the GUI's terminal
    or a GUI restart leaves it running), stdout+stderr appended to <run>/console.log; pass_fds:
    the run folder's lock, which the trainer's launcher keeps (run/run_lock.py)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / CONSOLE_LOG, "ab") as console:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=pass_fds)
    write_process_record(run_dir, proc.pid, argv)
    return proc


def write_process_record(run_dir: Path, pid: int, argv: list[str]) -> dict:
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = time.time()
    try:
        pgid = os.getpgid(pid)
    except OSError:
        pgid = pid
    record = {"pid": pid, "pgid": pgid, "started": started, "argv": argv, "host": socket.gethostname()}
    tmp = run_dir / (PROCESS_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
    tmp.replace(run_dir / PROCESS_FILE)
    return record


def read_process_record(run_dir: Path) -> dict | None:
    try:
        record = json.loads((Path(run_dir) / PROCESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("pid"), int) else None


def is_alive(record: dict | None) -> bool:
    """Is the process this record describes still running? Checks the host and the process's
    start time, so a recycled pid (after a reboot or a long time) is not mistaken for the run."""
    if not record or record.get("host") != socket.gethostname():
        return False
    try:
        proc = psutil.Process(record["pid"])
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - float(record.get("started", 0))) < 2.0
    except (psutil.Error, TypeError, ValueError):
        return False


def on_other_host(record: dict | None) -> bool:
    return bool(record) and record.get("host") != socket.gethostname()


def write_exit(run_dir: Path, code: int) -> None:
    (Path(run_dir) / EXIT_FILE).write_text(json.dumps({"code": code, "time": time.time()}), encoding="utf-8")


def read_exit(run_dir: Path) -> int | None:
    try:
        return int(json.loads((Path(run_dir) / EXIT_FILE).read_text(encoding="utf-8"))["code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def select_trainer_pids(processes: list[tuple[int, int, list[str]]]) -> list[int]:
    """From (pid, ppid, cmdline) of a run's process tree, the trainer ranks: processes running
    trainer_backend that are not a launcher (accelerate/torchrun, which would die or re-forward
    the signal) and not a forked copy of their parent (DataLoader workers share its cmdline)."""
    by_pid = {pid: (ppid, cmd) for pid, ppid, cmd in processes}
    ranks = []
    for pid, ppid, cmd in processes:
        if not any("trainer_backend" in part for part in cmd):
            continue
        program = " ".join(cmd[:cmd.index("trainer_backend")] if "trainer_backend" in cmd else cmd)
        if any(word in program for word in LAUNCHER_WORDS):
            continue
        if ppid in by_pid and by_pid[ppid][1] == cmd:
            continue
        ranks.append(pid)
    return ranks


def trainer_pids(record: dict) -> list[int]:
    """The rank processes of a live run (the root itself when it is the trainer)."""
    try:
        root = psutil.Process(record["pid"])
        tree = [root, *root.children(recursive=True)]
        procs = []
        for p in tree:
            try:
                procs.append((p.pid, p.ppid(), p.cmdline()))
            except psutil.Error:
                continue
    except psutil.Error:
        return []
    return select_trainer_pids(procs) or [record["pid"]]


def touch_control(run_dir: Path, name: str, content: str = "") -> Path:
    path = Path(run_dir) / CONTROL / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content or str(time.time()), encoding="utf-8")
    return path


def clear_control(run_dir: Path) -> None:
    for name in (STOP_MARK, SAVE_MARK, SAMPLE_MARK, STOP_TIME):
        (Path(run_dir) / CONTROL / name).unlink(missing_ok=True)


def stop_requested_at(run_dir: Path) -> float | None:
    try:
        return float((Path(run_dir) / CONTROL / STOP_TIME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def request_stop(run_dir: Path, record: dict) -> int:
    """Graceful stop: mark it as the user's, then SIGTERM each rank once (the trainer finishes
    the step, saves, exits 75). Returns how many processes were signalled."""
    touch_control(run_dir, STOP_MARK)
    touch_control(run_dir, STOP_TIME)
    sent = 0
    for pid in trainer_pids(record):
        try:
            os.kill(pid, signal.SIGTERM)
            sent += 1
        except OSError:
            pass
    return sent


def hard_kill(record: dict) -> bool:
    """SIGKILL the whole process group (launcher, ranks, workers). Unsaved progress is lost."""
    try:
        os.killpg(int(record.get("pgid") or record["pid"]), signal.SIGKILL)
        return True
    except OSError:
        return False
