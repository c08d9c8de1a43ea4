"""A checkpoint cannot run code: a pickle in any of its files whose __reduce__ would create a
marker file is refused with one line naming the file, and the marker never appears. The trainer's
own state is JSON; older checkpoints (scheduler as accelerate's pickle) still resume bitwise.
A damaged trainer_state.json is refused naming the file and the field (issue 37 items 1 and 6)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from checkpoint_harness import (assert_bitwise_equal, fast_inputs, lora_tensors, read_events,  # noqa: F401
                                reference_run, write_config, zygote)
from trainer_backend.run.checkpoint_files import checkpoints_dir, write_manifest


class Payload:
    """Unpickling this runs open(marker, 'w'): what a crafted checkpoint file would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _copy(reference_run, tmp_path, name: str, step: int = 8):
    run = tmp_path / "runs" / name
    src = checkpoints_dir(reference_run["run_dir"]) / f"step-{step:08d}"
    dst = checkpoints_dir(run) / src.name
    shutil.copytree(src, dst)
    return run, dst


@pytest.mark.parametrize("file_name, wrap", [
    ("custom_checkpoint_0.pkl", lambda p: {"last_epoch": 8, "x": p}),   # accelerate unpickled it with weights_only=False
    ("optimizer.bin", lambda p: {"state": {}, "param_groups": [p]}),
    ("random_states_0.pkl", lambda p: {"random_state": p}),             # accelerate skipped a bad one silently
    ("scaler.pt", lambda p: p),                                         # any file in the folder, loaded or not
])
def test_a_crafted_pickle_is_refused_and_never_runs(zygote, reference_run, fast_inputs, tmp_path, file_name, wrap):
    marker = tmp_path / "payload-ran"
    run, ckpt = _copy(reference_run, tmp_path, "crafted")
    torch.save(wrap(Payload(marker)), ckpt / file_name)
    write_manifest(ckpt, 8)  # the attacker rewrites the manifest too: it is no defence
    config = write_config(tmp_path / "c.toml", *fast_inputs, tmp_path / "runs", "crafted",
                          {"checkpoints": {"resume": str(ckpt)}})
    log = tmp_path / "c.log"
    rc = zygote.run(config, log)
    text = log.read_text()
    assert not marker.exists(), "the checkpoint's pickle ran code"
    assert rc == 2, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(ckpt / file_name) in errors[0] and "refused" in errors[0], text[-3000:]
    assert "weights_only=False" not in text and "Traceback" not in text
    assert not [e for e in read_events(run) if e["event"] == "step"]


def test_checkpoints_hold_no_pickled_trainer_state_and_old_ones_resume_bitwise(zygote, reference_run, fast_inputs,
                                                                              tmp_path):
    """New checkpoints: the scheduler as JSON, no custom_checkpoint pickle. An older checkpoint
    (the scheduler pickled by accelerate's register_for_checkpointing, as before) resumes through
    the weights_only unpickler and ends bitwise where the uninterrupted run did."""
    run, ckpt = _copy(reference_run, tmp_path, "legacy")
    scheduler = json.loads((ckpt / "lr_scheduler.json").read_text())
    assert scheduler["last_epoch"] == 8 and not list(ckpt.glob("custom_checkpoint_*"))
    torch.save(scheduler, ckpt / "custom_checkpoint_0.pkl")  # what accelerate's save_custom_state wrote
    os.remove(ckpt / "lr_scheduler.json")
    write_manifest(ckpt, 8)
    config = write_config(tmp_path / "l.toml", *fast_inputs, tmp_path / "runs", "legacy")
    log = tmp_path / "l.log"
    assert zygote.run(config, log) == 0, log.read_text()[-3000:]
    assert [e["step"] for e in read_events(run) if e["event"] == "step"] == [9, 10, 11, 12]
    assert_bitwise_equal(lora_tensors(run / "legacy.safetensors"), reference_run["lora"])
    newest = checkpoints_dir(run) / "step-00000012"
    assert (newest / "lr_scheduler.json").is_file() and not list(newest.glob("custom_checkpoint_*"))


@pytest.mark.parametrize("field, value, expected", [
    ("global_step", "lots", "global_step must be a whole number ≥ 0, got 'lots'"),
    ("epoch", -1, "epoch must be a whole number ≥ 0, got -1"),
    ("config", [], "config must be a JSON object"),
])
def test_a_damaged_trainer_state_is_refused_naming_the_file(zygote, reference_run, fast_inputs, tmp_path,
                                                           field, value, expected):
    run, ckpt = _copy(reference_run, tmp_path, "damaged")
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state[field] = value
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    write_manifest(ckpt, 8)
    config = write_config(tmp_path / "d.toml", *fast_inputs, tmp_path / "runs", "damaged")
    log = tmp_path / "d.log"
    assert zygote.run(config, log) == 2
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{ckpt / 'trainer_state.json'}: {expected}" in errors[0], text[-3000:]
    assert "Traceback" not in text
