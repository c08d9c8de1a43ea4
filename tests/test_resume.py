"""Resuming with a changed config: safe changes (a new LR, more steps, a moved dataset) are
allowed, logged and take effect; unsafe ones are refused with a message naming the option."""
from __future__ import annotations

import shutil

import pytest

from checkpoint_harness import (assert_bitwise_equal, child_env, fast_inputs, lora_tensors, read_events,  # noqa: F401
                                reference_run, write_config, zygote)
from trainer_backend.run.checkpoint_files import checkpoints_dir, load_state
from trainer_backend.config import ConfigError, load_config
from trainer_backend.data import scan_dataset
from trainer_backend.run.resume import check_compatible, dataset_fingerprint


def _resume_dir(reference_run, tmp_path, name: str, step: int):
    """A new run directory holding a copy of one of the reference run's checkpoints."""
    run = tmp_path / "runs" / name
    src = checkpoints_dir(reference_run["run_dir"]) / f"step-{step:08d}"
    shutil.copytree(src, checkpoints_dir(run) / src.name)
    return run


def _check(state, config, *overrides, processes=1, scan=False):
    """check_compatible for the config with overrides; the dataset is scanned only when asked
    (otherwise it is the checkpoint's own, unchanged)."""
    cfg = load_config(config, list(overrides))
    fingerprint = dataset_fingerprint(scan_dataset(cfg)) if scan else state.dataset_fingerprint
    return check_compatible(state, cfg, fingerprint, processes, "ckpt")


@pytest.mark.parametrize("override, key", [
    ("network.rank=8", "network.rank: changed from 4 to 8"),
    ("network.type='loha'", "network.type: changed from 'lora' to 'loha'"),
    ("network.target_modules=['to_q']", "network.target_modules"),
    ("optimizer.name='sgd'", "optimizer.name"),
    ("schedule.batch_size=2", "schedule.batch_size"),
    ("schedule.seed=7", "schedule.seed"),
    ("precision.mixed='fp16'", "precision.mixed: changed from no to fp16"),
    ("dataset.bucketing=true", "dataset.bucketing"),
    # adapter options that once counted as safe: the new adapters silently started from scratch
    ("network.dora=true", "network.dora: changed from False to True"),
    ("network.conv_rank=4", "network.conv_rank: changed from 0 to 4"),
    ("network.conv_alpha=2.0", "network.conv_alpha"),
    ("network.conv_target_modules=['conv1']", "network.conv_target_modules"),
    ("network.lokr_factor=4", "network.lokr_factor"),
])
def test_unsafe_option_changes_are_refused(reference_run, override, key):
    state = load_state(checkpoints_dir(reference_run["run_dir"]) / "step-00000008")
    with pytest.raises(ConfigError) as e:
        _check(state, reference_run["config"], *override.split())
    assert str(e.value).startswith(key) and "output.name" in str(e.value)


def test_model_dataset_and_process_count_changes(reference_run, fast_inputs, tiny_models, tmp_path):
    state = load_state(checkpoints_dir(reference_run["run_dir"]) / "step-00000008")
    config = reference_run["config"]
    with pytest.raises(ConfigError, match="^model.path: the checkpoint was trained on sd1, this config uses sd2"):
        _check(state, config, f"model.path='{tiny_models('sd2')}'")
    with pytest.raises(ConfigError, match="^hardware.num_processes: .* 1 process.*this run has 2"):
        _check(state, config, processes=2)

    moved = shutil.copytree(fast_inputs[1], tmp_path / "moved-data")  # same contents elsewhere: fine
    assert _check(state, config, f"dataset.path='{moved}'", scan=True) == []
    (moved / "img000.txt").write_text("a different caption")
    with pytest.raises(ConfigError, match="^dataset.path: the dataset's contents changed .*captions or control images differ"):
        _check(state, config, f"dataset.path='{moved}'", scan=True)
    shutil.copy(fast_inputs[1] / "img001.png", moved / "extra.png")
    with pytest.raises(ConfigError, match=r"^dataset.path: .*\(4 images then, 5 now\)"):
        _check(state, config, f"dataset.path='{moved}'", scan=True)

    safe = _check(state, config, "optimizer.lr=0.005", "schedule.max_steps=20", "network.dropout=0.0",
                  "dataset.resolution=48")  # no bucketing: every image is cropped alike, the order stays
    assert safe == ["dataset.resolution: 32 -> 48", "network.dropout: 0.1 -> 0.0", "optimizer.lr: 0.01 -> 0.005",
                    "schedule.max_steps: 12 -> 20"]


def test_refusal_through_the_cli(zygote, reference_run, fast_inputs, tmp_path):
    _resume_dir(reference_run, tmp_path, "wider", 8)
    config = write_config(tmp_path / "w.toml", *fast_inputs, tmp_path / "runs", "wider", {"network": {"rank": 8}})
    log = tmp_path / "w.log"
    assert zygote.run(config, log) == 2
    assert "error: network.rank: changed from 4 to 8 since the checkpoint" in log.read_text()


def test_new_lr_applies_from_the_resumed_step(zygote, reference_run, fast_inputs, tmp_path):
    """The optimizer state restores the old LR; the new one takes over at the same point of the
    schedule (half the LR here, so half the reference's LR at every remaining step)."""
    run = _resume_dir(reference_run, tmp_path, "halved", 8)
    config = write_config(tmp_path / "h.toml", *fast_inputs, tmp_path / "runs", "halved",
                          {"optimizer": {"lr": 5e-3}})
    log = tmp_path / "h.log"
    assert zygote.run(config, log) == 0, log.read_text()[-3000:]
    reference_lr = {e["step"]: e["lr"] for e in read_events(reference_run["run_dir"]) if e["event"] == "step"}
    resumed_lr = {e["step"]: e["lr"] for e in read_events(run) if e["event"] == "step"}
    assert sorted(resumed_lr) == [9, 10, 11, 12]
    for step, lr in resumed_lr.items():
        assert lr == pytest.approx(reference_lr[step] / 2, rel=1e-9)
    text = (run / "train.log").read_text()
    assert "changed since the checkpoint (allowed): optimizer.lr: 0.01 -> 0.005" in text
    assert "base lr 0.01 -> 0.005" in text


def test_more_steps_continue_and_a_finished_run_only_exports(zygote, reference_run, fast_inputs, tmp_path):
    # the final checkpoint with the same config: no step is trained again, the output is rewritten
    run = _resume_dir(reference_run, tmp_path, "again", 12)
    config = write_config(tmp_path / "a.toml", *fast_inputs, tmp_path / "runs", "again")
    assert zygote.run(config, tmp_path / "a.log") == 0
    assert not [e for e in read_events(run) if e["event"] == "step"]
    assert_bitwise_equal(lora_tensors(run / "again.safetensors"), reference_run["lora"])
    # ... with the uninterrupted run's metadata, ss_epoch included (issue 17 item 17: it said 1 epoch less)
    from safetensors import safe_open
    with safe_open(str(run / "again.safetensors"), "pt") as f, \
            safe_open(str(reference_run["run_dir"] / "reference.safetensors"), "pt") as g:
        ours, theirs = f.metadata(), g.metadata()
    assert ours["ss_epoch"] == theirs["ss_epoch"] == "3" and ours["ss_steps"] == theirs["ss_steps"] == "12"
    # more steps (a safe change): the run continues from step 12 to 16
    config = write_config(tmp_path / "m.toml", *fast_inputs, tmp_path / "runs", "again", {"schedule": {"max_steps": 16}})
    assert zygote.run(config, tmp_path / "m.log") == 0
    steps = [e["step"] for e in read_events(run) if e["event"] == "step"]
    assert steps == [13, 14, 15, 16]
    assert "schedule.max_steps: 12 -> 16" in (run / "train.log").read_text()


def test_every_option_declares_what_changing_it_means_for_a_resume():
    """Declared on the field itself (F(resume=...)), nested tables included; unsafe ones give a reason."""
    from trainer_backend.config import DatasetSubset, WebhookTarget, all_fields
    from trainer_backend.config.base import RESUME_KINDS, RESUME_REASONS
    declared = [(f"{f['section']}.{f['key']}", f["resume"]) for f in all_fields()]
    for cls in (DatasetSubset, WebhookTarget):
        declared += [(f"{cls.__name__}.{k}", (i.json_schema_extra or {}).get("resume", ""))
                     for k, i in cls.model_fields.items()]
    for key, resume in declared:
        kind, _, reason = resume.partition(":")
        assert kind in RESUME_KINDS, f"{key}: no resume declaration ({resume!r})"
        assert not kind.startswith("unsafe") or reason in RESUME_REASONS, key


@pytest.mark.parametrize("override", ["network.dora=true", "network.conv_rank=4", "network.conv_alpha=2.0",
                                      "network.conv_target_modules=['conv1']", "network.lokr_factor=4"])
def test_adapter_shape_changes_are_refused_without_training(override):
    """The bug this declaration fixed, checked on a recorded config alone (no run needed): these
    changes once counted as safe and the new adapters silently started from scratch."""
    from trainer_backend.config import strip_secrets, to_dict
    from trainer_backend.run.checkpoint_files import TrainState
    saved = load_config(None, ["model.path=builtin:tiny-sd1", "network.type=lora"])
    from trainer_backend.config.caching import with_auto_caching  # the trainer records the resolved config
    state = TrainState(global_step=8, config=strip_secrets(to_dict(with_auto_caching(saved))),
                       dataset_fingerprint="1:x")
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"^{key}: changed from .* since the checkpoint"):
        check_compatible(state, load_config(None, ["model.path=builtin:tiny-sd1", "network.type=lora", override]),
                         "1:x", 1, "ckpt")
    assert check_compatible(state, load_config(None, ["model.path=builtin:tiny-sd1", "network.type=lora",
                                                      "optimizer.lr=5e-5"]), "1:x", 1, "ckpt") == \
        ["optimizer.lr: 0.0001 -> 5e-05"]
