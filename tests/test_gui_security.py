"""Exposure rules for `python app.py` and secret handling."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gui.security import OPT_OUT_FLAG, SecurityError, check_exposure, is_loopback, parse_auth

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--listen"], ["--share"], ["--host", "192.168.1.20"],
                                  ["--host", "studio.example.com"]])
def test_exposed_without_auth_refuses_to_start(args, tmp_path):
    out = subprocess.run([sys.executable, "app.py", *args, "--port", "1", "--runs-dir", str(tmp_path / "runs")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--auth" in out.stderr and OPT_OUT_FLAG in out.stderr
    assert not (tmp_path / "runs").exists()   # refused before doing anything


def test_exposure_rules():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("example.com")
    assert check_exposure("127.0.0.1", False, None, False) == ""
    assert check_exposure("0.0.0.0", False, [("u", "p")], False) == ""
    with pytest.raises(SecurityError):
        check_exposure("127.0.0.1", True, None, False)       # --share is public even from loopback
    assert "WITHOUT authentication" in check_exposure("0.0.0.0", False, None, True)


def test_auth_from_argument_or_file(tmp_path):
    assert parse_auth("alice:pw1,bob:p:w") == [("alice", "pw1"), ("bob", "p:w")]
    f = tmp_path / "users"
    f.write_text("# users\ncarol:secret\n\n")
    os.chmod(f, 0o600)
    assert parse_auth(str(f)) == [("carol", "secret")]
    for bad in ("alice", "alice:", ":pw", str(tmp_path / "nope" / "file")):
        with pytest.raises(SecurityError):
            parse_auth(bad)


def test_secret_names_come_from_the_config():
    from trainer_backend.config import from_dict
    from gui.secrets_panel import env_from_rows, secret_names, status_markdown
    cfg = from_dict({"webhooks": {"targets": [{"url": "http://127.0.0.1:1/hook", "auth_secret": "HOOK_TOKEN"}]},
                     "logging": {"wandb_key_name": "MY_WANDB"}})
    names = dict(secret_names(cfg))
    assert names["webhooks.targets.0.auth_secret"] == "HOOK_TOKEN"
    assert names["logging.wandb_key_name"] == "MY_WANDB"
    assert names["cloud.secret_key_name"] == "AWS_SECRET_ACCESS_KEY"
    typed = env_from_rows(["HOOK_TOKEN", "abc", "bad name!", "x", "", "y", "EMPTY", ""])
    assert typed == {"HOOK_TOKEN": "abc"}
    table = status_markdown(cfg, typed)
    assert "`HOOK_TOKEN` | `webhooks.targets.0.auth_secret` | typed here" in table
    assert "abc" not in table


def test_secret_typed_in_the_gui_reaches_the_trainer_and_no_file(tmp_path):
    """A real demo run whose webhook needs a token typed in the page: the local webhook server
    receives it (so it reached the process environment), and no file of the run contains it."""
    import http.server
    import threading
    import time

    from trainer_backend.config import from_dict, to_dict
    from gui.shared_state import Settings, Studio

    received: list[str] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(self.headers.get("Authorization", ""))
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = "Bearer s3cr3t-typed-in-the-gui-4711"
    studio = Studio.create(Settings(runs_dir=tmp_path / "runs", presets_dir=tmp_path / "presets"))
    data = to_dict(studio.load_preset("demo-sd1-lora (built-in)"))
    data["schedule"]["max_steps"] = 2
    data["webhooks"]["targets"] = [{"url": f"http://127.0.0.1:{server.server_port}/hook",
                                    "auth_secret": "STUDIO_HOOK_TOKEN", "events": ["start", "done"]}]
    cfg = from_dict(data)
    try:
        run_dir = studio.manager.start(cfg, secret_env={"STUDIO_HOOK_TOKEN": secret})
        deadline = time.time() + 300
        while time.time() < deadline and (run_dir / "process.json").exists():
            studio.manager.reap()
            if (run_dir / "exit.json").exists():
                break
            time.sleep(0.5)
        assert (run_dir / "exit.json").exists(), "the demo run did not finish"
        studio.store.save("after-run", cfg)
    finally:
        server.shutdown()
    assert secret in received, (received, (run_dir / "console.log").read_text()[-2000:])
    files = [p for p in run_dir.rglob("*") if p.is_file()] + list((tmp_path / "presets").glob("*.toml"))
    assert any(p.name == "config.toml" for p in files) and any(p.name == "command.txt" for p in files)
    for path in files:
        assert secret.encode() not in path.read_bytes(), f"the secret leaked into {path}"
        assert b"s3cr3t" not in path.read_bytes(), f"the secret leaked into {path}"
    assert "STUDIO_HOOK_TOKEN" not in os.environ            # the studio's own environment is untouched


def test_allowed_hosts_for_each_binding():
    from gui.security import allowed_hosts
    assert set(allowed_hosts("127.0.0.1", False)) == {"localhost", "127.0.0.1", "::1", "[::1]"}
    assert "studio.lan" in allowed_hosts("studio.lan", False)
    assert allowed_hosts("0.0.0.0", False) == ["*"] and allowed_hosts("127.0.0.1", True) == ["*"]


def test_a_rebound_host_name_is_refused(tmp_path):
    """DNS rebinding: a page on evil.example rebinds its name to 127.0.0.1 and POSTs to the studio.
    The server answers only the host names it was started for."""
    import http.client
    from urllib.parse import urlparse
    from test_browser_studio import Server
    server = Server(tmp_path, sigint_ignored=True).start()
    try:
        port = urlparse(server.url).port

        def status(host: str, method: str = "GET", path: str = "/") -> int:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request(method, path, body=b"{}" if method == "POST" else None,
                         headers={"Host": host, "Content-Type": "application/json"})
            code = conn.getresponse().status
            conn.close()
            return code

        assert status(f"127.0.0.1:{port}") == 200 and status(f"localhost:{port}") == 200
        assert status(f"evil.example:{port}") == 400
        assert status(f"evil.example:{port}", "POST", "/gradio_api/run/predict") == 400
        # Ctrl+C closes the studio (its exit handlers end its TensorBoards) even when it was started
        # with SIGINT ignored; before, it ignored it and the caller had to kill it after a timeout
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=60) == 0
        assert "closing server" in next(tmp_path.glob("app-*.log")).read_text()
    finally:
        server.stop()
