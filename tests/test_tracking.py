"""W&B tracking through accelerate: an offline run on tiny SD1 holds the logged keys and the
config, and the API key (from a secrets file) appears in no file of the run; clear errors when
wandb is missing or the user is not logged in."""
import json
import os
import struct
import sys
import time
from pathlib import Path

import pytest

from conftest import make_dataset
from trainer_backend.config import ConfigError, load_config
from trainer_backend.config.checks import validate_for_run

SECRET = "wbkey-3f9c1e77a1b2c3d4e5f60718293a4b5c6d7e8f90"


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def wandb_records(path: Path) -> list:
    """Records of an offline .wandb file: a 7-byte header, then LevelDB-log framing (32 KiB
    blocks, each chunk: crc32 u32, length u16, type u8) around protobuf Record messages."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        if pos + 7 + length > len(data):  # still being written
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL/FIRST start, MIDDLE/LAST continue
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def complete_records(path: Path, wait_s: float = 60.0) -> list:
    """The file's records once wandb-core (a separate process, writing asynchronously) has
    written the run's final `exit` record."""
    deadline = time.monotonic() + wait_s
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def history_rows(records) -> list[dict]:
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
    return rows


def logged_config(records) -> dict:
    config = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        updates = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        for item in updates:
            config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config


@pytest.fixture
def clean_wandb_env(monkeypatch, tmp_path):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_IDENTITY_TOKEN_FILE", "MY_WB_KEY",
                 "WANDB_SILENT"):
        monkeypatch.setenv(name, "")  # recorded first, so the teardown also removes what the run sets
        monkeypatch.delenv(name)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    yield


def test_offline_wandb_run_has_the_logged_keys_and_no_secret(tmp_path, tiny_models, clean_wandb_env):
    pytest.importorskip("wandb", reason="the wandb package (test extra) is not installed")
    from trainer_backend.training.loop import train
    secrets = tmp_path / "secrets.env"
    secrets.write_text(f"MY_WB_KEY={SECRET}\n")
    secrets.chmod(0o600)
    data = make_dataset(tmp_path / "data", n=2, size=32)
    cfg = validate_for_run(load_config(None, [
        f"model.path={tiny_models('sd1')}", f"dataset.path={data}", "dataset.resolution=32",
        f"output.dir={tmp_path / 'runs'}", "output.name=wb", "precision.mixed=no", "network.rank=4",
        "hardware.cpu=true", "logging.tensorboard=false", "schedule.max_steps=3", "checkpoints.at_end=false",
        "logging.tracker=wandb", "logging.wandb_mode=offline", "logging.wandb_project=studio-test",
        "logging.wandb_key_name=MY_WB_KEY", f"cloud.secrets_file={secrets}"]))
    assert train(cfg) == 0
    run = cfg.run_dir
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list(run.rglob("*"))
    records = complete_records(files[0])
    rows = [r for r in history_rows(records) if "train/loss" in r]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["event"] == "step"]
    assert [r["_step"] for r in rows] == [e["step"] for e in steps] == [1, 2, 3]
    for row, event in zip(rows, steps):
        assert row["train/loss"] == pytest.approx(event["loss"])
        assert row["train/lr"] == pytest.approx(event["lr"])
        assert row["train/epoch"] == event["epoch"]
        assert row["train/samples"] == event["samples"] == event["step"]  # batch 1, one process
    config = logged_config(records)
    assert config["optimizer"]["lr"] == cfg.optimizer.lr and config["network"]["rank"] == 4
    assert config["logging"]["wandb_key_name"] == "MY_WB_KEY"  # the name only
    leaks = [str(p) for p in run.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaks, f"the API key was written to {leaks}"


def test_online_without_credentials_says_how_to_log_in(tmp_path, clean_wandb_env):
    from trainer_backend.remote.wandb_tracking import api_key, check_login
    cfg = load_config(None, ["logging.tracker=wandb", "logging.wandb_mode=online"])
    with pytest.raises(ConfigError) as err:
        check_login(cfg, api_key(cfg))
    message = str(err.value)
    assert message.startswith("logging.tracker:") and "WANDB_API_KEY" in message
    assert "wandb login" in message and "offline" in message
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai login user password abc\n")
    netrc.chmod(0o600)
    os.environ["NETRC"] = str(netrc)  # restored by the fixture's monkeypatch
    check_login(cfg, api_key(cfg))  # `wandb login` credentials count


def test_wandb_selected_but_not_installed(monkeypatch):
    from trainer_backend.remote.wandb_tracking import log_with
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` sees without the package
    cfg = load_config(None, ["logging.tracker=wandb"])
    with pytest.raises(ConfigError, match=r"logging.tracker: 'wandb' needs the wandb package"):
        log_with(cfg)
    assert log_with(load_config(None, [])) is None  # off by default: nothing imported, nothing needed
