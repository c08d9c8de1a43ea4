"""The API on a real headless studio (`python app.py --headless`, a subprocess), real SQLite, a real
tiny trainer: tokens, 401/403/422, 20 concurrent submits, and a SIGKILLed studio that restarts,
keeps the queue's order and re-adopts the running trainer, which ends `done`."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
DATASET = ROOT / "assets" / "demo_dataset"


def tiny_config(name: str, steps: int = 2) -> str:
    return (f'[model]\npath = "builtin:tiny-sd1"\n[dataset]\npath = "{DATASET}"\nresolution = 32\n'
            f'[schedule]\nmax_steps = {steps}\n[output]\nname = "{name}"\n')


def app(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "app.py"), *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, **kw)


class Studio:
    """A headless studio on a free loopback port; `restart` after `kill` reuses the same folders."""

    def __init__(self, runs: Path):
        self.runs, self.proc = runs, None
        self.port = free_port()

    def start(self) -> "Studio":
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--headless", "--runs-dir", str(self.runs),
                                      "--port", str(self.port)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/openapi.json", timeout=2)
                return self
            except OSError:
                assert self.proc.poll() is None, self.proc.stderr.read().decode()
                time.sleep(0.2)
        raise AssertionError("the headless studio did not answer in 60 s")

    def token(self, name: str, scope: str = "write") -> str:
        out = app("--runs-dir", str(self.runs), "--new-token", name, "--scope", scope)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().splitlines()[-1].split()[-1]     # the last word of the last line

    def call(self, method: str, path: str, token: str | None = None, body=None) -> tuple[int, object]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/v1{path}", method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                return r.status, json.loads(raw) if r.headers.get("content-type", "").startswith("application/json") else raw
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def kill(self, sig=signal.SIGKILL) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)


@pytest.fixture
def studio(tmp_path):
    made = []

    def make():
        s = Studio(tmp_path / "runs")
        made.append(s)
        return s
    yield make
    for s in made:
        if s.proc and s.proc.poll() is None:
            s.kill()


def wait_for(studio, token, job_id, statuses, timeout=180):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        code, job = studio.call("GET", f"/jobs/{job_id}", token)
        if code == 200 and job["status"] in statuses:
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} never reached {statuses}: {job}")


def test_every_route_needs_a_token_and_a_read_token_cannot_write(studio):
    s = studio()
    read = s.token("reader", "read")
    s.start()
    spec = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{s.port}/api/v1/openapi.json").read())
    routes = [(m.upper(), p.replace("{job_id}", "1").replace("{name}", "x")) for p, ms in spec["paths"].items()
              for m in ms]
    assert len(routes) >= 13
    for method, path in routes:
        body = {} if method == "POST" else None
        assert s.call(method, path, None, body)[0] == 401, (method, path)
        assert s.call(method, path, "sdq_not-a-token", body)[0] == 401, (method, path)
    writes = [(m, p) for m, p in routes if m in ("POST", "DELETE")]
    for method, path in writes:
        assert s.call(method, path, read, {"config_toml": "", "where": "up"})[0] == 403, (method, path)
    assert s.call("GET", "/jobs", read) == (200, {"jobs": [], "paused": False})


def test_a_bad_config_is_422_with_every_problem_naming_its_key(studio, tmp_path):
    s = studio()
    token = s.token("ci")
    s.start()
    code, body = s.call("POST", "/jobs", token, {"config_toml": '[model]\npath = "/nowhere/model"\n'
                                                                 f'[dataset]\npath = "{tmp_path / "none"}"\n'})
    assert code == 422
    keys = {p["key"] for p in body["detail"]}
    assert {"model.path", "dataset.path"} <= keys and all(p["message"] for p in body["detail"])
    code, body = s.call("POST", "/jobs", token, {"config_toml": tiny_config("x").replace(
        '[output]\nname = "x"\n', '[output]\nname = "x"\ndir = "/tmp/elsewhere"\n')})
    assert code == 422 and body["detail"][0]["key"] == "output.dir" and "--allow-output-dir" in body["detail"][0]["message"]


def test_twenty_concurrent_submits_lose_none_and_duplicate_none(studio):
    s = studio()
    token = s.token("ci")
    s.start()
    assert s.call("POST", "/queue/pause", token, {})[0] == 200       # nothing starts: only the queue is tested
    answers = []

    def submit(i):
        answers.append(s.call("POST", "/jobs", token, {"config_toml": tiny_config(f"job-{i:02d}"), "priority": i % 3}))
    threads = [threading.Thread(target=submit, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [code for code, _ in answers] == [201] * 20
    ids = [body["id"] for _, body in answers]
    assert len(set(ids)) == 20
    code, listing = s.call("GET", "/jobs", token)
    waiting = listing["jobs"]
    assert sorted(j["id"] for j in waiting) == sorted(ids) and {j["status"] for j in waiting} == {"waiting"}
    assert sorted(j["name"] for j in waiting) == [f"job-{i:02d}" for i in range(20)]
    assert [j["priority"] for j in waiting] == sorted((j["priority"] for j in waiting), reverse=True)


def test_a_killed_studio_restarts_with_the_same_order_and_readopts_the_running_trainer(studio, tmp_path):
    """The client waits through the restart and exits 0 when the adopted job is done."""
    first = studio()
    token = first.token("ci")
    first.start()
    config = tmp_path / "trainer.toml"
    config.write_text(tiny_config("trainer", steps=3))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SD_STUDIO_URL": f"http://127.0.0.1:{first.port}",
           "SD_STUDIO_TOKEN": token}
    client = subprocess.Popen([sys.executable, "-m", "trainer_backend.client", "submit", str(config), "--wait"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + 60
    while not (jobs := first.call("GET", "/jobs", token)[1]["jobs"]) and time.monotonic() < end:
        time.sleep(0.2)
    job = jobs[0]
    assert job["run_dir"] == str(first.runs.resolve() / "trainer")
    running = wait_for(first, token, job["id"], ("running",))
    first.call("POST", "/queue/pause", token, {})
    for i, prio in enumerate((0, 2, 0, 1)):
        assert first.call("POST", "/jobs", token, {"config_toml": tiny_config(f"w{i}"), "priority": prio})[0] == 201
    waiting = [j["id"] for j in first.call("GET", "/jobs?status=waiting", token)[1]["jobs"]]
    assert first.call("POST", f"/jobs/{waiting[-1]}/move", token, {"where": "top"})[0] == 200
    order = [j["id"] for j in first.call("GET", "/jobs?status=waiting", token)[1]["jobs"]]
    assert order[0] == waiting[-1]

    first.kill(signal.SIGKILL)          # the studio dies; the trainer lives in its own process group
    second = Studio(first.runs)
    second.port = first.port
    second.start()
    try:
        assert [j["id"] for j in second.call("GET", "/jobs?status=waiting", token)[1]["jobs"]] == order
        done = wait_for(second, token, job["id"], ("done", "error", "interrupted", "stopped"))
        assert done["status"] == "done" and done["pid"] == running["pid"]     # the same process, adopted
        assert done["step"] == done["total"] == 3
        code, files = second.call("GET", f"/jobs/{job['id']}/files", token)
        sizes = {f["name"]: f["size"] for f in files["files"]}
        assert sizes["trainer.safetensors"] > 0
        code, data = second.call("GET", f"/jobs/{job['id']}/files/trainer.safetensors", token)
        assert code == 200 and data == (first.runs / "trainer" / "trainer.safetensors").read_bytes()
        code, log = second.call("GET", f"/jobs/{job['id']}/log?after=0", token)
        assert code == 200 and any("started by the queue" in line for line in log["lines"])
        assert second.call("GET", f"/jobs/{job['id']}/files/..%2Fqueue", token)[0] == 404
        req = urllib.request.Request(f"http://127.0.0.1:{second.port}/api/v1/jobs/{job['id']}/events",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=30) as r:       # the job has ended: the stream ends too
            assert r.headers["content-type"].startswith("text/event-stream")
            stream = r.read().decode()
        events = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {\"")]
        assert events[-1]["event"] == "done" and [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3]
        assert stream.rstrip().endswith("event: end\ndata: {}")
        assert second.call("POST", f"/jobs/{job['id']}/checkpoint", token, {})[0] == 409    # not running
        assert second.call("DELETE", f"/jobs/{order[0]}", token)[0] == 200
        assert second.call("DELETE", f"/jobs/{job['id']}", token)[0] == 409      # only waiting jobs
        out, _ = client.communicate(timeout=60)
        assert client.returncode == 0, out
        assert "done" in out.splitlines()[-1]     # it waited through the restart (down or not when it polled)
        got = subprocess.run([sys.executable, "-m", "trainer_backend.client", "download", str(job["id"]), "--to",
                              str(tmp_path / "got")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert got.returncode == 0 and (tmp_path / "got" / "trainer.safetensors").read_bytes() == data
        client_cmd = [sys.executable, "-m", "trainer_backend.client"]
        status = subprocess.run([*client_cmd, "status", str(job["id"])], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 0 and status.stdout.startswith(f"job {job['id']} trainer: done")
        logs = subprocess.run([*client_cmd, "logs", "-f", str(job["id"])], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)        # -f ends with the job
        assert logs.returncode == 0 and logs.stdout.splitlines() == log["lines"]
        config.write_text('[schedule]\nbatch_size = 0\n[output]\nname = "bad"\n')
        bad = subprocess.run([sys.executable, "-m", "trainer_backend.client", "submit", str(config)], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "schedule.batch_size" in bad.stderr
    finally:
        second.kill(signal.SIGTERM)
