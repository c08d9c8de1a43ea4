"""Secrets (S3 keys, webhook tokens and URLs) come from the environment or a 0600 secrets file
and appear nowhere: not in the run directory, the bucket, presets, argv, events or logs."""
from __future__ import annotations

import logging
import subprocess

import pytest

from checkpoint_harness import (ACCESS_KEY, PY, ROOT, SECRET_KEY, MotoServer, Recorder, cloud_section,  # noqa: F401
                                env_without_aws, fast_inputs, read_events, write_config, write_secrets_file)
from trainer_backend.config import ConfigError, load_config
from trainer_backend.remote.secrets import MaskSecrets, Secrets, parse_secrets_file, read_secrets_file
from trainer_backend.remote.webhooks import resolve_targets

HOOK_TOKEN = "Bearer hooktok-9f8e7d6c5b4a"
HOOK_PATH = "/hooks/abc/URLTOKEN-31337"


def test_secrets_appear_nowhere_after_a_run_with_s3_and_webhooks(fast_inputs, tmp_path):
    from gui.presets import PresetStore
    from trainer_backend.launch.argv import build_launch_argv

    moto = MotoServer(tmp_path / "moto.log")
    recorder = Recorder()
    try:
        bucket = moto.make_bucket("secret-run")
        secrets = write_secrets_file(tmp_path / "secrets.env", AWS_ACCESS_KEY_ID=ACCESS_KEY,
                                     AWS_SECRET_ACCESS_KEY=SECRET_KEY, HOOK_TOKEN=HOOK_TOKEN,
                                     HOOK_URL=recorder.url + HOOK_PATH)
        config = write_config(tmp_path / "s.toml", *fast_inputs, tmp_path / "runs", "secretive", {
            "schedule": {"max_steps": 4},
            "cloud": cloud_section(moto, bucket, secrets),
            "webhooks": {"targets": [{"url_secret": "HOOK_URL", "auth_secret": "HOOK_TOKEN"}]}})
        r = subprocess.run([PY, "-m", "trainer_backend", "launch", "--config", str(config)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600, env=env_without_aws())
        assert r.returncode == 0, r.stderr[-3000:]
        run = tmp_path / "runs" / "secretive"

        # the secrets were used: the bucket got the checkpoints, the webhook its header
        assert any(k.endswith("manifest.json") for k in moto.keys(bucket))
        hooks = recorder.at(HOOK_PATH)
        assert hooks and all(h["headers"]["Authorization"] == HOOK_TOKEN for h in hooks)

        # ... and are nowhere else
        cfg = load_config(run / "config.toml")
        preset = PresetStore(tmp_path / "presets").save("from-run", cfg)
        haystacks = {"console": (r.stdout + r.stderr).encode(),
                     "argv": " ".join(build_launch_argv(cfg, run / "config.toml")).encode(),
                     "preset": preset.path.read_bytes()}
        for path in run.rglob("*"):
            if path.is_file():
                haystacks[str(path.relative_to(tmp_path))] = path.read_bytes()
        client = moto.client()
        for key in moto.keys(bucket):
            haystacks[f"s3://{bucket}/{key}"] = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert "command.txt" in " ".join(haystacks) and "events.jsonl" in " ".join(haystacks)
        for secret in (ACCESS_KEY, SECRET_KEY, HOOK_TOKEN, "hooktok-9f8e7d6c5b4a", "URLTOKEN-31337"):
            leaks = [name for name, data in haystacks.items() if secret.encode() in data]
            assert not leaks, f"{secret[:6]}… found in {leaks}"
        assert [e for e in read_events(run) if e["event"] == "done"]
    finally:
        recorder.close()
        moto.close()


def test_secrets_file_format_and_permissions(tmp_path):
    text = "# credentials\nexport AWS_ACCESS_KEY_ID=AKIA123\nAWS_SECRET_ACCESS_KEY = 'abc=def'\n\nTOKEN=\"x y\"\n"
    assert parse_secrets_file(text) == {"AWS_ACCESS_KEY_ID": "AKIA123", "AWS_SECRET_ACCESS_KEY": "abc=def",
                                        "TOKEN": "x y"}
    path = tmp_path / "secrets.env"
    path.write_text(text)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"cloud.secrets_file: .* readable by other users .*chmod 600"):
        read_secrets_file(path)
    path.chmod(0o600)
    assert read_secrets_file(path)["TOKEN"] == "x y"
    path.write_text("no equals sign here\n")
    with pytest.raises(ConfigError, match="cloud.secrets_file: .*line 1"):
        read_secrets_file(path)


def test_environment_first_and_missing_secrets_name_the_key(tmp_path):
    secrets = Secrets({"A": "from-file", "B": "file-only"}, environ={"A": "from-env"})
    assert secrets.get("A") == "from-env" and secrets.get("B") == "file-only" and secrets.get("C") is None
    cfg = load_config(None, ['webhooks.targets=[{url="http://127.0.0.1:9/x", auth_secret="NOPE"}]'])
    with pytest.raises(ConfigError, match=r"webhooks.targets\[0\].auth_secret: secret 'NOPE'"):
        resolve_targets(cfg, Secrets({}, environ={}))
    cfg = load_config(None, ['webhooks.targets=[{url_secret="HOOK"}]'])
    assert resolve_targets(cfg, Secrets({"HOOK": "https://example.org/h/tok"}, environ={}))[0].label == \
        "https://example.org"


def test_log_records_are_masked(caplog):
    logger = logging.getLogger("trainer.test-mask")
    mask = MaskSecrets({"s3cr3t-value"})
    caplog.handler.addFilter(mask)
    try:
        try:
            raise RuntimeError("auth failed for s3cr3t-value")
        except RuntimeError:
            logger.exception("upload failed with key %s", "s3cr3t-value")
    finally:
        caplog.handler.removeFilter(mask)
    assert "s3cr3t-value" not in caplog.text and "***" in caplog.text
