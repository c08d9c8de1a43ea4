"""Checkpoint folders: triggers, manifests, retention (keep-last, keep-every, keep-best), exports
named with the step, corrupt or incomplete folders never chosen, and a disk that fills up
while a checkpoint is written."""
from __future__ import annotations

import json
import shutil

from checkpoint_harness import (assert_bitwise_equal, fast_inputs, lora_tensors, read_events,  # noqa: F401
                                reference_run, valid_steps, wait_for_event, write_config, zygote)
from trainer_backend.run.checkpoint_files import (MANIFEST, checkpoints_dir, clean_incomplete, is_valid, list_checkpoints,
                                         read_manifest)
from trainer_backend.run.resume import find_local
from trainer_backend.run.retention import RetentionPolicy, retained_steps


def test_retention_policy():
    ckpts = [(s, {"loss": loss}) for s, loss in [(100, 0.9), (200, 0.5), (300, 0.7), (400, 0.4), (500, 0.8),
                                                 (600, 0.6), (700, 0.95)]]
    assert retained_steps(ckpts, RetentionPolicy(keep_last=2)) == {600, 700}
    assert retained_steps(ckpts, RetentionPolicy(keep_last=2, keep_every=200)) == {200, 400, 600, 700}
    assert retained_steps(ckpts, RetentionPolicy(keep_last=1, keep_best=2)) == {700, 400, 200}
    # checkpoints without the metric (saved before any loss was seen) never count as best
    assert retained_steps([(1, {}), (2, {"loss": float("nan")}), (3, {"loss": 1.0})],
                          RetentionPolicy(keep_last=1, keep_best=1)) == {3}
    assert retained_steps([(5, {"validation_loss": 0.2}), (6, {"validation_loss": 0.3})],
                          RetentionPolicy(keep_last=1, keep_best=1, metric="validation_loss")) == {5, 6}


def _triggers(run_dir) -> dict[int, str]:
    return {int(p.name[5:]): read_manifest(p)["trigger"] for p in list_checkpoints(run_dir)}


def test_time_trigger_manifests_and_keep_best(zygote, fast_inputs, tmp_path):
    """every_n_minutes so small that every step is due: every step saves ("time"); keep_last=1
    with keep_best=2 leaves the newest plus the two lowest mean losses since their previous
    checkpoint, which here is each step's own loss."""
    config = write_config(tmp_path / "t.toml", *fast_inputs, tmp_path / "runs", "timed", {"checkpoints": {
        "every_n_steps": 0, "every_n_minutes": 1e-6, "keep_last": 1, "keep_every_n_steps": 0, "keep_best": 2}})
    assert zygote.run(config, tmp_path / "t.log") == 0, (tmp_path / "t.log").read_text()[-3000:]
    run = tmp_path / "runs" / "timed"
    events = read_events(run)
    losses = {e["step"]: e["loss"] for e in events if e["event"] == "step"}
    saved = [e for e in events if e["event"] == "checkpoint"]
    assert [e["step"] for e in saved] == list(range(1, 13)) and {e["trigger"] for e in saved} == {"time"}
    best_two = sorted(losses, key=losses.get)[:2]
    assert set(valid_steps(run)) == {12, *best_two}
    for path in list_checkpoints(run):
        manifest = read_manifest(path)
        assert abs(manifest["metrics"]["loss"] - losses[manifest["step"]]) < 1e-12
        files = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != MANIFEST}
        assert set(manifest["files"]) == files  # everything, with sizes and sha256
        assert {"adapter_unet.safetensors", "optimizer.bin", "trainer_state.json", "random_states_0.pkl"} <= files
        assert is_valid(path, verify_hashes=True)


def test_epoch_request_and_end_triggers_with_exports(zygote, fast_inputs, tmp_path):
    """Checkpoints every 2nd epoch (4 steps per epoch: step 8) with a LoRA export named with the
    step, a save-now request from the GUI's control file, and the final checkpoint at the end
    (step 10, inside the 3rd epoch)."""
    config = write_config(tmp_path / "e.toml", *fast_inputs, tmp_path / "runs", "epochs", {
        "schedule": {"max_steps": 10},
        "checkpoints": {"every_n_steps": 0, "every_n_epochs": 2, "keep_every_n_steps": 0, "keep_last": 10,
                        "export_at": "epochs"}})
    run = tmp_path / "runs" / "epochs"
    child = zygote.spawn(config, tmp_path / "e.log")
    assert wait_for_event(run, child, lambda e: e["event"] == "start") is not None
    (run / "control" / "save_now").write_text("")
    assert child.wait() == 0, (tmp_path / "e.log").read_text()[-3000:]
    triggers = _triggers(run)
    requested = [s for s, t in triggers.items() if t == "request"]
    assert len(requested) == 1 and requested[0] < 8
    assert {s: t for s, t in triggers.items() if t != "request"} == {8: "epochs", 10: "end"}
    assert sorted(p.name for p in run.glob("epochs-step*.safetensors")) == ["epochs-step00000008.safetensors"]
    assert not (run / "control" / "save_now").exists()
    # an export is a complete LoRA file of its step's weights (training went on after it)
    at_8, final = lora_tensors(run / "epochs-step00000008.safetensors"), lora_tensors(run / "epochs.safetensors")
    assert at_8.keys() == final.keys()
    assert any(not (at_8[k] == final[k]).all() for k in final if k.endswith("lora_up.weight"))
    state = json.loads((checkpoints_dir(run) / "step-00000010" / "trainer_state.json").read_text())
    assert state["global_step"] == 10 and state["epoch"] == 3 and state["batch_in_epoch"] == 0  # ended in epoch 3


def test_incomplete_and_corrupt_folders_are_never_chosen(reference_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reference_run["run_dir"] / "checkpoints", run / "checkpoints")
    steps = valid_steps(run)
    newest = checkpoints_dir(run) / f"step-{steps[-1]:08d}"
    # a newer folder without manifest, a temporary folder, and bit rot in the newest complete one
    (checkpoints_dir(run) / "step-00000099").mkdir()
    (checkpoints_dir(run) / "step-00000099" / "optimizer.bin").write_bytes(b"x" * 10)
    (checkpoints_dir(run) / ".tmp-step-00000013").mkdir()
    data = bytearray((newest / "optimizer.bin").read_bytes())
    data[100] ^= 0xFF
    (newest / "optimizer.bin").write_bytes(bytes(data))
    assert is_valid(newest) and not is_valid(newest, verify_hashes=True)
    assert find_local(run) == checkpoints_dir(run) / f"step-{steps[-2]:08d}"
    removed = {p.name for p in clean_incomplete(run)}
    assert removed == {"step-00000099", ".tmp-step-00000013"}
    # a truncated file fails even the quick size check
    (newest / "optimizer.bin").write_bytes(bytes(data[:-1]))
    assert not is_valid(newest) and newest not in list_checkpoints(run)


def test_disk_full_keeps_the_previous_checkpoint(zygote, reference_run, fast_inputs, tmp_path):
    """A run stopped (SIGTERM) after a few steps is continued with writes limited below the size
    of optimizer.bin (RLIMIT_FSIZE: the write fails in the kernel with EFBIG, as it would with
    ENOSPC on a full disk). It fails clearly at the next checkpoint, the previous one stays
    valid and nothing half-written is left; with room again, a restart resumes from it and ends
    with the uninterrupted run's weights."""
    import signal
    config = write_config(tmp_path / "f.toml", *fast_inputs, tmp_path / "runs", "full")
    run = tmp_path / "runs" / "full"
    child = zygote.spawn(config, tmp_path / "a.log")
    assert wait_for_event(run, child, lambda e: e["event"] == "step" and e["step"] >= 3) is not None
    child.signal(signal.SIGTERM)
    assert child.wait() == 75
    last = valid_steps(run)[-1]
    previous = checkpoints_dir(run) / f"step-{last:08d}"
    optimizer_size = (previous / "optimizer.bin").stat().st_size
    adapter_size = (previous / "adapter_unet.safetensors").stat().st_size
    assert adapter_size < optimizer_size // 2

    log = tmp_path / "b.log"
    assert zygote.run(config, log, fsize=optimizer_size // 2 + adapter_size // 2) == 1
    errors = [e for e in read_events(run) if e["event"] == "error"]
    assert len(errors) == 1
    message = errors[0]["message"]
    assert "could not write checkpoint" in message and f"step-{last + 1:08d}" in message
    assert f"step-{last:08d} is intact" in message and "Free disk space" in message
    assert "could not write checkpoint" in log.read_text()
    assert "Traceback" not in log.read_text() and "Traceback" in (run / "train.log").read_text()  # issue 17 item 15
    assert valid_steps(run)[-1] == last and is_valid(previous, verify_hashes=True)
    assert not [p for p in checkpoints_dir(run).iterdir() if p.name.startswith(".")]

    assert zygote.run(config, tmp_path / "c.log") == 0, (tmp_path / "c.log").read_text()[-3000:]
    assert [e["step"] for e in read_events(run) if e["event"] == "resumed"][-1] == last
    assert_bitwise_equal(lora_tensors(run / "full.safetensors"), reference_run["lora"])
