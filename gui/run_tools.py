"""What kohya_ss users reach for next to a run: TensorBoard on its tb/ folder (loopback, a free
port, one server per run) and downloads (each output file, the whole run folder as a zip)."""
from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer_backend.run.contract import TENSORBOARD_DIR, TENSORBOARD_LOG

_LOCK = threading.Lock()
_SERVERS: dict[Path, tuple[subprocess.Popen, int]] = {}
DOWNLOADS = ".downloads"   # under the runs folder (gradio serves only from there); never a run itself


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensorboard_url(run_dir: Path, python: str = sys.executable) -> str:
    """Start (or reuse) TensorBoard on <run>/tb, bound to 127.0.0.1; returns its URL.
    Raises FileNotFoundError when the run has no tb/ folder yet."""
    tb = Path(run_dir).resolve() / TENSORBOARD_DIR
    if not tb.is_dir():
        raise FileNotFoundError(f"{tb} does not exist yet (logging.tensorboard off, or no step logged)")
    with _LOCK:
        known = _SERVERS.get(tb)
        if known and known[0].poll() is None:
            return f"http://127.0.0.1:{known[1]}/"
        port = _free_port()
        log = open(Path(run_dir) / TENSORBOARD_LOG, "ab")
        proc = subprocess.Popen([python, "-m", "tensorboard.main", "--logdir", str(tb), "--host", "127.0.0.1",
                                 "--port", str(port), "--reload_interval", "5"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        _SERVERS[tb] = (proc, port)
    return f"http://127.0.0.1:{port}/"


def wait_until_serving(url: str, timeout_s: float = 60.0) -> bool:
    import urllib.request
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return True
        except OSError:
            time.sleep(0.5)
    return False


def stop_all() -> None:
    """End the TensorBoard servers this studio started (at exit)."""
    with _LOCK:
        for proc, _ in _SERVERS.values():
            if proc.poll() is None:
                proc.terminate()
        _SERVERS.clear()


def output_files(run_dir: Path, outputs: list[str]) -> list[str]:
    """Downloadable files among a run's outputs (a diffusers folder is offered as a zip)."""
    files = []
    for o in outputs:
        path = Path(o) if Path(o).is_absolute() else Path(run_dir) / o
        if path.is_file():
            files.append(str(path))
        elif path.is_dir():
            files.append(zip_folder(path, Path(run_dir).parent / DOWNLOADS / f"{Path(run_dir).name}-{path.name}"))
    return files


def zip_folder(folder: Path, base: Path) -> str:
    """<base>.zip of a folder, rebuilt only when the folder changed since the last zip."""
    target = base.with_suffix(".zip")
    newest = max((p.stat().st_mtime for p in [folder, *folder.rglob("*")] if p.exists()), default=0)
    if target.is_file() and target.stat().st_mtime >= newest:
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.stem}-{os.getpid()}")
    made = shutil.make_archive(str(tmp), "zip", root_dir=folder.parent, base_dir=folder.name)
    os.replace(made, target)
    return str(target)


def run_zip(run_dir: Path) -> str:
    """The whole run folder (config, logs, checkpoints, samples, outputs) as one zip."""
    run_dir = Path(run_dir).resolve()
    return zip_folder(run_dir, run_dir.parent / DOWNLOADS / run_dir.name)


atexit.register(stop_all)
