"""Hub models through the real CLI against the loopback hub (tests/hub_server.py): a run trained on
`org/tiny-sd1` (download events in the run folder, the log's progress lines), a `download` killed in the
middle and resumed by the next one, and a second download waiting on the first instead of fetching twice."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from conftest import make_dataset
from hub_server import HubServer, client_env
from trainer_backend.config import dumps_toml

ROOT = Path(__file__).resolve().parents[1]
BIG = "unet/diffusion_pytorch_model.safetensors"


def _env(hub, tmp_path, **extra):
    return {**os.environ, **client_env(hub, tmp_path / "hf"), "PYTHONPATH": str(ROOT), **extra}


def _download(hub, tmp_path, *args, **popen):
    return subprocess.Popen([sys.executable, "-m", "trainer_backend", "download", *args], cwd=ROOT,
                            env=_env(hub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)


def _partial_size(tmp_path) -> int:
    blobs = tmp_path / "hf" / "hub" / "models--org--big" / "blobs"
    return sum(p.stat().st_size for p in blobs.glob("*.sd-studio-partial")) if blobs.is_dir() else 0


def _wait(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def hub():
    with HubServer() as server:
        yield server


def test_a_run_trains_on_a_hub_model_after_a_stop_during_its_download(hub, tiny_models, tmp_path):
    """Run 1 is stopped (SIGTERM, the studio's Stop) while the weights download: it ends as a stop, not an
    error. Run 2 (the same config, as Start again does) downloads the rest and trains."""
    hub.add_folder("org/tiny-sd1", tiny_models("sd1"))
    hub.faults.throttle[BIG] = 200_000  # ~20 s for the UNet: run 1 is stopped long before
    make_dataset(tmp_path / "data", n=2, size=32)
    config = {"output": {"dir": str(tmp_path / "runs"), "name": "from-hub"},
              "model": {"path": "org/tiny-sd1"},
              "dataset": {"path": str(tmp_path / "data"), "resolution": 32},
              "network": {"rank": 2, "alpha": 2.0}, "schedule": {"max_steps": 2, "batch_size": 1},
              "precision": {"mixed": "no"}, "hardware": {"cpu": True}}
    (tmp_path / "run.toml").write_text(dumps_toml(config))
    argv = [sys.executable, "-m", "trainer_backend", "train", "--config", str(tmp_path / "run.toml")]
    run = tmp_path / "runs" / "from-hub"

    def events() -> list[dict]:
        path = run / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    first = subprocess.Popen(argv, cwd=ROOT, env=_env(hub, tmp_path), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    _wait(lambda: any(e.get("file") == BIG for e in events()), seconds=300)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 75, err[-2000:]  # stopped, nothing lost; not an error
    assert events()[-1]["event"] in ("stopped", "preempted")
    planned = next(e for e in events() if e["event"] == "download")
    assert planned["status"] == "planned" and planned["total"] > 1_000_000 and planned["free_bytes"] > 0

    hub.faults.throttle.clear()
    r = subprocess.run(argv, cwd=ROOT, env=_env(hub, tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    downloads = [e for e in events() if e["event"] == "download"]
    assert downloads[-1]["status"] == "done" and downloads[-1]["bytes"] == downloads[-1]["total"] > 1_000_000
    assert events()[-1]["event"] == "done" and (run / "from-hub.safetensors").is_file()
    log = (run / "train.log").read_text()
    assert "download: org/tiny-sd1: downloaded" in log and "free on the cache's disk" in log
    assert tomllib.loads((run / "config.toml").read_text())["model"]["path"] == "org/tiny-sd1"  # the id, kept
    assert (tmp_path / "hf" / "hub" / "models--org--tiny-sd1" / "snapshots").is_dir()


def test_a_killed_download_resumes_and_a_second_one_waits(hub, tmp_path):
    """The weight is served slowly; the first download is killed (SIGKILL: nothing cleans up) once
    more than one of huggingface_hub's 10 MB write chunks is on disk; the next run asks only for the
    rest. Meanwhile-started downloads wait on the lock and fetch nothing themselves."""
    payload = os.urandom(12 * 1024 * 1024)
    hub.add_files("org/big", {"model_index.json": b'{"_class_name": "StableDiffusionPipeline"}', BIG: payload})
    hub.faults.throttle[BIG] = 8 * 1024 * 1024
    first = _download(hub, tmp_path, "org/big", "--kind", "files")
    _wait(lambda: _partial_size(tmp_path) >= 10 * 1024 * 1024)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    kept = _partial_size(tmp_path)
    assert kept >= 10 * 1024 * 1024

    hub.faults.throttle[BIG] = 1024 * 1024  # slow enough that the waiting one starts while this one runs
    second = _download(hub, tmp_path, "org/big", "--kind", "files")
    _wait(lambda: any(r.range for r in hub.file_requests(BIG)))
    third = _download(hub, tmp_path, "org/big", "--kind", "files")
    out2, err2 = second.communicate(timeout=120)
    out3, err3 = third.communicate(timeout=120)
    assert second.returncode == 0 and third.returncode == 0, err2[-2000:] + err3[-2000:]
    gets = hub.file_requests(BIG)
    assert [r.range for r in gets] == [None, f"bytes={kept}-"]  # resumed, and fetched by one process only
    assert "waiting for another process" in err3
    folder = Path(out2.strip())
    assert Path(out3.strip()) == folder
    assert hashlib.sha256((folder / BIG).read_bytes()).digest() == hashlib.sha256(payload).digest()
    assert "downloaded" in err2
