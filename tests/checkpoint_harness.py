"""Helpers for the checkpoint/resume/signal/S3/webhook tests.

Starting `python -m trainer_backend train` costs 10–20 s on this 2-core machine, almost all of
it importing torch, diffusers and transformers. The kill tests need many restarts, so they run
the trainer in processes forked from a *zygote*: a Python process that has done those imports
(and nothing else: no torch thread pool exists yet) and then forks one child per run. Each
child is a real OS process running exactly `trainer_backend.__main__.main(["train", ...])`,
killed with real signals; only the import time is shared. The slow kill test uses plain
`python -m trainer_backend train` subprocesses instead.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import tomli_w

from conftest import ROOT, free_port, make_dataset

PY = sys.executable

ZYGOTE = r"""
import json, os, resource, signal, sys, traceback
sys.path.insert(0, os.getcwd())
import torch, accelerate, peft, safetensors.torch, boto3               # the slow imports, once
import diffusers, transformers
from diffusers import UNet2DConditionModel, AutoencoderKL, DDPMScheduler  # noqa: resolve lazy modules
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer  # noqa
import trainer_backend.__main__, trainer_backend.training.loop, trainer_backend.families.sd.loader  # noqa
import trainer_backend.remote.s3, trainer_backend.remote.uploader, trainer_backend.remote.webhooks  # noqa
reply = sys.stdout
print(json.dumps({"ready": True}), file=reply, flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "spawn":
        pid = os.fork()
        if pid == 0:
            fd = os.open(cmd["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1); os.dup2(fd, 2)
            os.environ.clear(); os.environ.update(cmd["env"])
            if cmd.get("fsize"):
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a too-big write fails with EFBIG
                resource.setrlimit(resource.RLIMIT_FSIZE, (cmd["fsize"], cmd["fsize"]))
            rc = 1
            try:
                rc = trainer_backend.__main__.main(cmd["argv"])
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(rc)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
    elif cmd["op"] == "wait":
        _, status = os.waitpid(cmd["pid"], 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)
"""


class Child:
    def __init__(self, zygote: "Zygote", pid: int, log: Path):
        self.zygote, self.pid, self.log, self.rc = zygote, pid, log, None

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self) -> int:
        if self.rc is None:
            self.rc = self.zygote.request({"op": "wait", "pid": self.pid})["rc"]
            self.zygote.children.discard(self)
        return self.rc


class Zygote:
    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen([PY, "-c", ZYGOTE], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.env = env
        self.children: set[Child] = set()
        assert self.read()["ready"]

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"zygote exited with {self.proc.wait()}")
        return json.loads(line)

    def request(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def spawn(self, config: Path, log: Path, env: dict[str, str] | None = None, fsize: int = 0) -> Child:
        """Start `train --config config` in a forked child (stdout/stderr appended to log); env
        replaces the zygote's environment when given."""
        reply = self.request({"op": "spawn", "argv": ["train", "--config", str(config)], "log": str(log),
                              "env": self.env if env is None else env, "fsize": fsize})
        child = Child(self, reply["pid"], log)
        self.children.add(child)
        return child

    def run(self, config: Path, log: Path, env: dict[str, str] | None = None, fsize: int = 0) -> int:
        return self.spawn(config, log, env, fsize).wait()

    def close(self) -> None:
        for child in list(self.children):
            try:
                child.signal(signal.SIGKILL)
                child.wait()
            except (OSError, RuntimeError):
                pass
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def child_env(**extra: str) -> dict[str, str]:
    """The trainer processes' environment. One OpenMP thread: on this shared 2-core machine two
    threads spin against the other engineers' load (a 32 px step: 0.1 s with one, up to 4 s
    with two), and every run of a bitwise comparison must use the same thread count."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


# ----------------------------------------------------------------------------- configs and runs

def write_config(path: Path, model_dir: Path, data_dir: Path, runs_dir: Path, name: str,
                 extra: dict | None = None) -> Path:
    """The fast test config: tiny SD1, 32 px, 4 images, LoRA rank 4, 12 steps, a checkpoint
    every step, CPU fp32. `extra` is merged per section."""
    cfg = {
        "model": {"path": str(model_dir)},
        "dataset": {"path": str(data_dir), "resolution": 32},
        "output": {"dir": str(runs_dir), "name": name},
        "network": {"rank": 4, "alpha": 4, "dropout": 0.1},
        "optimizer": {"lr": 1e-2, "scheduler": "cosine", "warmup_steps": 2},
        "schedule": {"max_steps": 12},
        "precision": {"mixed": "no"},
        "hardware": {"cpu": True},
        "checkpoints": {"every_n_steps": 1, "keep_last": 2, "keep_every_n_steps": 4},
        "logging": {"tensorboard": False},
    }
    for section, values in (extra or {}).items():
        cfg.setdefault(section, {}).update(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(cfg), encoding="utf-8")
    return path


def make_inputs(root: Path, tiny_models) -> tuple[Path, Path]:
    return tiny_models("sd1"), make_dataset(root / "data", n=4, size=32)


def read_events(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "events.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line cut by SIGKILL
    return out


def wait_for_event(run_dir: Path, child: Child, pred, since: int = 0, timeout: float = 300) -> dict | None:
    """Poll events.jsonl (from index `since`) until pred(event) holds; None if the child exits first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for ev in read_events(run_dir)[since:]:
            if pred(ev):
                return ev
        try:
            os.kill(child.pid, 0)
            if _is_zombie(child.pid):
                return None
        except OSError:
            return None
        time.sleep(0.05)
    raise TimeoutError("no matching event")


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (OSError, IndexError):
        return False


def lora_tensors(path: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(path))


def assert_bitwise_equal(a: dict, b: dict) -> None:
    import torch
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def valid_steps(run_dir: Path) -> list[int]:
    from trainer_backend.run.checkpoint_files import list_checkpoints, step_of
    return [step_of(p) for p in list_checkpoints(run_dir)]


# ----------------------------------------------------------------------------- shared fixtures
# Test modules import these fixtures; the module-level caches make the zygote, the inputs and
# the uninterrupted reference run exist once per session whichever module asks first.

_SHARED: dict = {}


def shared_zygote() -> Zygote:
    if "zygote" not in _SHARED:
        _SHARED["zygote"] = Zygote(child_env())
        atexit.register(_SHARED["zygote"].close)
    return _SHARED["zygote"]


@pytest.fixture(scope="session")
def zygote() -> Zygote:
    return shared_zygote()


@pytest.fixture(scope="session")
def fast_inputs(tmp_path_factory, tiny_models) -> tuple[Path, Path]:
    if "inputs" not in _SHARED:
        _SHARED["inputs"] = make_inputs(tmp_path_factory.mktemp("ckpt-inputs"), tiny_models)
    return _SHARED["inputs"]


@pytest.fixture(scope="session")
def reference_run(zygote, fast_inputs, tmp_path_factory) -> dict:
    """The fast config run once without interruption: its LoRA tensors and surviving checkpoints."""
    if "reference" not in _SHARED:
        root = tmp_path_factory.mktemp("ckpt-reference")
        config = write_config(root / "reference.toml", *fast_inputs, root / "runs", "reference")
        rc = zygote.run(config, root / "console.log")
        assert rc == 0, (root / "console.log").read_text()[-3000:]
        run_dir = root / "runs" / "reference"
        _SHARED["reference"] = {"lora": lora_tensors(run_dir / "reference.safetensors"),
                                "steps": valid_steps(run_dir), "run_dir": run_dir, "config": config}
    return _SHARED["reference"]


# ----------------------------------------------------------------------------- S3 (moto) and secrets

ACCESS_KEY = "TESTKEYEXAMPLESECRET7Q2Z"              # distinctive values: the secrets tests grep for them
SECRET_KEY = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYzzSECRET42"


class MotoServer:
    """moto's S3-compatible server on a free loopback port (a real HTTP endpoint, in memory)."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(PY).parent / "moto_server"
        cmd = [str(exe)] if exe.exists() else [PY, "-m", "moto.server"]
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(self.port)], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client().list_buckets()
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY,
                            config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}))

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        out = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return out

    def pause(self) -> None:
        """The endpoint stops answering (SIGSTOP): connections hang until the client times out."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.resume()
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()


def write_secrets_file(path: Path, **values: str) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()), encoding="utf-8")
    path.chmod(0o600)
    return path


def cloud_section(moto: MotoServer, bucket: str, secrets_file: Path, **extra) -> dict:
    return {"bucket": bucket, "endpoint_url": moto.url, "region": "us-east-1", "prefix": "team/runs",
            "secrets_file": str(secrets_file), "timeout_s": 2, **extra}


def env_without_aws(**extra: str) -> dict[str, str]:
    """The child environment minus any AWS_* variable: credentials come from the secrets file."""
    return {**{k: v for k, v in child_env().items() if not k.startswith("AWS_")}, **extra}


# ----------------------------------------------------------------------------- webhooks

class Recorder:
    """A local HTTP server that records every POST; paths under /slow are held until release()."""

    def __init__(self):
        self.requests: list[dict] = []
        self.held = threading.Event()
        self.release_event = threading.Event()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recorder.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if self.path.startswith("/slow"):
                    recorder.held.set()
                    recorder.release_event.wait(120)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def at(self, path: str) -> list[dict]:
        return [r for r in self.requests if r["path"] == path]

    def close(self):
        self.release_event.set()
        self.server.shutdown()
