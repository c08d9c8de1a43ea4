"""Values that must be refused with one line naming the key, inputs that must not hang the scan,
and folders that must not overlap (issue: never lose a user's files or a run)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, make_dataset
from trainer_backend.config import ConfigError, load_config


@pytest.mark.parametrize("override, key, words", [
    ("optimizer.lr=nan", "optimizer.lr", "finite number"),
    ("optimizer.weight_decay=inf", "optimizer.weight_decay", "finite number"),
    ("loss.noise_offset=-inf", "loss.noise_offset", "finite number"),
    ("schedule.max_steps=1e20", "schedule.max_steps", "1e+20"),
    ("cloud.prefix='../../..'", "cloud.prefix", "pattern"),
    ("cloud.prefix='runs/../x'", "cloud.prefix", "pattern"),
])
def test_refused_naming_the_key(override, key, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value).startswith(f"{key}: ") and words in str(e.value)


def test_ordinary_values_still_pass():
    cfg = load_config(None, ["cloud.prefix='team/runs-2026/'", "schedule.max_steps=200000", "optimizer.lr=1e-4"])
    assert cfg.cloud.prefix == "team/runs-2026/"


def test_preset_names_keep_letters_of_any_script():
    from gui.presets import sanitize_name
    assert sanitize_name("über 中文") == "über 中文"
    assert sanitize_name("../x/y") == "x-y"


def test_run_folder_and_dataset_must_not_overlap(tmp_path):
    from trainer_backend.config.checks import validate_for_run
    data = make_dataset(tmp_path / "data", n=1, size=32)
    base = ["model.path=builtin:tiny-sd1", f"dataset.path={data}"]
    with pytest.raises(ConfigError) as e:
        validate_for_run(load_config(None, [*base, f"output.dir={data}", "output.name=run"]))
    assert str(e.value).startswith("output.dir: ") and "dataset.path" in str(e.value)
    with pytest.raises(ConfigError) as e:
        validate_for_run(load_config(None, ["model.path=builtin:tiny-sd1", f"dataset.path={tmp_path / 'runs/r/d'}",
                                            f"output.dir={tmp_path / 'runs'}", "output.name=r"]))
    assert str(e.value).startswith(("dataset.path: ",))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_the_dataset_is_skipped_not_waited_on(tmp_path):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    os.mkfifo(data / "pipe.png")
    (data / "img000.txt").unlink()
    os.mkfifo(data / "img000.txt")  # a caption that is a FIFO
    out = subprocess.run([sys.executable, "-m", "trainer_backend", "inspect", "--set", f"dataset.path={data}",
                          "--set", "dataset.resolution=32"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])["summary"]
    text = json.dumps(summary)
    assert "pipe.png" in text and "not a regular file" in text


def test_only_the_configs_own_secrets_reach_the_trainer(tmp_path):
    """Secrets typed in the studio: LD_PRELOAD or PYTHONPATH would change what runs; refused by name."""
    from gui.run_control import RunManager, StartRefused, _check_secret_names
    data = make_dataset(tmp_path / "data", n=1, size=32)
    cfg = load_config(None, ["model.path=builtin:tiny-sd1", f"dataset.path={data}", f"output.dir={tmp_path / 'runs'}"])
    _check_secret_names(cfg, {"WANDB_API_KEY": "k"})  # a name the config refers to (logging.wandb_key_name)
    manager = RunManager(tmp_path / "runs", cwd=tmp_path)
    for name in ("LD_PRELOAD", "PYTHONPATH"):
        with pytest.raises(StartRefused, match=f"secret {name}: not a secret this config refers to"):
            manager.start(cfg, secret_env={name: "/tmp/evil.so"})
    assert not (tmp_path / "runs" / cfg.output.name).exists()  # nothing was started or written
