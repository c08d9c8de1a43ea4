"""End to end: a LoRA run through the real CLI on a dataset with several bad files, with latent
caching on disk. The run finishes, names every bad file in its log, trains on the good ones,
and leaves the dataset folder byte-for-byte and mtime-for-mtime untouched."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_data_helpers import caption, snapshot, write_image
from trainer_backend.config import dumps_toml

from conftest import ROOT

BAD_FILES = ["notes.png", "half.png", "tiny.png"]


def test_lora_run_survives_bad_files_and_never_writes_the_dataset(tmp_path, tiny_models):
    data = tmp_path / "dataset"
    for i in range(3):
        caption(write_image(data / "2_thing" / f"good{i}.png", 64, 64, seed=i), f"a thing number {i}")
    (data / "2_thing" / "notes.png").write_text("not an image")
    whole = write_image(data / "2_thing" / "half.png", 64, 64, seed=9).read_bytes()
    (data / "2_thing" / "half.png").write_bytes(whole[: len(whole) // 2])
    write_image(data / "2_thing" / "tiny.png", 8, 8)
    caption(write_image(data / "2_thing" / "blank.png", 64, 64, seed=5), "   ")
    before = snapshot(data)

    cache = tmp_path / "latent-cache"
    config = {"output": {"dir": str(tmp_path / "runs"), "name": "bad-files"},
              "model": {"path": str(tiny_models("sd1"))},
              "dataset": {"path": str(data), "resolution": 64, "flip": True, "cache_latents": True,
                          "cache_latents_to_disk": True, "cache_dir": str(cache)},
              "network": {"rank": 4, "alpha": 4.0},
              "schedule": {"max_steps": 2, "batch_size": 2},
              "precision": {"mixed": "no"}, "hardware": {"cpu": True}}
    (tmp_path / "run.toml").write_text(dumps_toml(config))
    r = subprocess.run([sys.executable, "-m", "trainer_backend", "train", "--config", str(tmp_path / "run.toml")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]

    run = tmp_path / "runs" / "bad-files"
    assert (run / "bad-files.safetensors").is_file()
    log = (run / "train.log").read_text()
    for name in BAD_FILES:
        assert f"{name}: skipped" in log, name
    assert "blank.txt is empty" in log
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    plan = next(e for e in events if e["event"] == "plan")
    assert plan["subsets"][0]["images"] == 4 and plan["single"]["samples_per_epoch"] == 8   # 4 good × 2 repeats
    assert events[-1]["event"] == "done"
    assert len(list(cache.rglob("*.safetensors"))) == 8      # 4 images × both flips
    assert snapshot(data) == before
