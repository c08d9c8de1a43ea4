"""Exposure rules for `python app.py` and secret handling."""
from __future__ import annotations

import os
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


def test_secrets_stay_out_of_presets_config_argv_and_command(tmp_path):
    """Secret fields typed in the form reach the process environment only."""
    from trainer_backend.config import from_dict, to_dict
    from gui.context import Settings, Studio
    from gui.schema_form import form_fields
    secret_fields = [f for f in form_fields() if f.secret]
    if not secret_fields:
        pytest.skip("the schema has no secret fields yet")
    studio = Studio.create(Settings(runs_dir=tmp_path / "runs", presets_dir=tmp_path / "presets"))
    data = to_dict(studio.load_preset("demo-sd1-lora (built-in)"))
    for i, f in enumerate(secret_fields):
        data[f.section][f.key] = f"TOPSECRET{i}abc"
    cfg = from_dict(data)
    shell, argv, toml = studio.command_preview(cfg)
    assert "TOPSECRET" not in shell + argv + toml
    studio.store.save("s", cfg)
    assert "TOPSECRET" not in (tmp_path / "presets" / "s.toml").read_text()
