"""Never lose a user's files or a run (issue 17, trainer side): a folder that is not a run is
refused and left untouched; corrupt checkpoints neither start a silent fresh run nor count toward
retention; a repeated signal cannot cut the stop sequence (save + upload) short, and a stop
during start-up ends cleanly; checkpoints and cache files are fsynced before they get their names."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from checkpoint_harness import (ACCESS_KEY, PY, ROOT, SECRET_KEY, MotoServer, child_env,  # noqa: F401
                                cloud_section, env_without_aws, fast_inputs, read_events, reference_run,
                                valid_steps, wait_for_event, write_config, write_secrets_file, zygote)
from trainer_backend.run import exitcodes
from trainer_backend.run.checkpoint_files import checkpoints_dir


def _error_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("case", ["user folder", "a file", "under /proc", "NUL byte"])
def test_a_run_folder_is_new_or_a_run_and_nothing_else_is_touched(zygote, fast_inputs, tmp_path, case):
    """Item 1 (and 15): output.dir/output.name naming the user's folder of documents, a file, a
    system folder or a NUL byte: exit 2, one line naming the key, the user's files untouched."""
    docs = tmp_path / "v" / "Docs"
    docs.mkdir(parents=True)
    (docs / "taxes.pdf").write_bytes(b"%PDF precious")
    (docs / "photos").mkdir()
    before = sorted(p.relative_to(docs) for p in docs.rglob("*"))
    out_dir, name, key = {"user folder": (tmp_path / "v", "Docs", "output.name"),
                          "a file": (docs / "taxes.pdf", "run", "output.dir"),
                          "under /proc": (Path("/proc/self"), "run", "output.dir"),
                          "NUL byte": (str(tmp_path / "v") + "\0x", "run", "output.dir")}[case]
    config = write_config(tmp_path / "c.toml", *fast_inputs, tmp_path / "unused", "x",
                          {"output": {"dir": str(out_dir), "name": name}})
    log = tmp_path / "c.log"
    assert zygote.run(config, log) == exitcodes.BAD_CONFIG, log.read_text()[-3000:]
    errors = _error_lines(log)
    assert len(errors) == 1 and errors[0].startswith(f"error: {key}:"), log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
    assert sorted(p.relative_to(docs) for p in docs.rglob("*")) == before
    assert (docs / "taxes.pdf").read_bytes() == b"%PDF precious"


def _copy_reference(reference_run, run_dir: Path) -> list[int]:
    shutil.copytree(checkpoints_dir(reference_run["run_dir"]), checkpoints_dir(run_dir))
    return valid_steps(run_dir)


def _corrupt(run_dir: Path, step: int) -> None:
    path = checkpoints_dir(run_dir) / f"step-{step:08d}" / "optimizer.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF   # same size: only the sha256 check can tell
    path.write_bytes(bytes(data))


def test_all_checkpoints_corrupt_refuses_to_start_over(zygote, reference_run, fast_inputs, tmp_path):
    """Item 2: every local checkpoint fails its hash. The run does not silently start fresh (whose new
    checkpoints retention would prune at once): exit 2 naming them and checkpoints.resume; with
    resume = "none" it starts over and the corrupt ones are kept aside, not deleted."""
    run_dir = tmp_path / "runs" / "rotten"
    steps = _copy_reference(reference_run, run_dir)
    for step in steps:
        _corrupt(run_dir, step)
    config = write_config(tmp_path / "r.toml", *fast_inputs, tmp_path / "runs", "rotten")
    log = tmp_path / "r.log"
    assert zygote.run(config, log) == exitcodes.BAD_CONFIG, log.read_text()[-3000:]
    errors = _error_lines(log)
    assert len(errors) == 1 and "checkpoints.resume" in errors[0] and '"none"' in errors[0], errors
    assert all(f"step-{s:08d}" in errors[0] for s in steps)
    assert valid_steps(run_dir) == steps, "the corrupt checkpoints must stay where they are"
    assert not [e for e in read_events(run_dir) if e["event"] in ("start", "step")]

    config = write_config(tmp_path / "n.toml", *fast_inputs, tmp_path / "runs", "rotten",
                          {"checkpoints": {"resume": "none"}, "schedule": {"max_steps": 3}})
    assert zygote.run(config, tmp_path / "n.log") == 0, (tmp_path / "n.log").read_text()[-3000:]
    aside = list(run_dir.glob("checkpoints-replaced-*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == [f"step-{s:08d}" for s in steps]


def test_a_corrupt_checkpoint_never_counts_toward_retention(zygote, reference_run, fast_inputs, tmp_path):
    """Item 2: the two newest checkpoints (11, 12) rot. The run resumes from step 8 and ends at step
    10: its new checkpoints 9 and 10 are the newest two kept (keep_last = 2), not pruned in favour of
    the corrupt 11 and 12."""
    run_dir = tmp_path / "runs" / "partly"
    steps = _copy_reference(reference_run, run_dir)
    assert steps[-2:] == [11, 12] and 8 in steps
    _corrupt(run_dir, 11)
    _corrupt(run_dir, 12)
    config = write_config(tmp_path / "p.toml", *fast_inputs, tmp_path / "runs", "partly",
                          {"schedule": {"max_steps": 10}})
    log = tmp_path / "p.log"
    assert zygote.run(config, log) == 0, log.read_text()[-3000:]
    assert [e["step"] for e in read_events(run_dir) if e["event"] == "resumed"] == [8]
    assert valid_steps(run_dir) == [4, 8, 9, 10]


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.close()


def test_a_repeated_signal_cannot_cut_the_stop_upload_short(moto, zygote, fast_inputs, tmp_path):
    """Item 4: SIGTERM, the stop checkpoint is saved, its upload waits on a bucket that does not
    answer; a second SIGTERM arrives (a launcher forwarding twice). The trainer still finishes the
    upload once the bucket is back and exits 75 (it used to die of the second SIGTERM, exit -15)."""
    bucket = moto.make_bucket("twice")
    secrets = write_secrets_file(tmp_path / "s.env", AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    config = write_config(tmp_path / "t.toml", *fast_inputs, tmp_path / "runs", "twice",
                          {"cloud": cloud_section(moto, bucket, secrets, final_wait_s=120),
                           "checkpoints": {"every_n_steps": 0, "keep_every_n_steps": 0}})
    run_dir, log = tmp_path / "runs" / "twice", tmp_path / "t.log"
    child = zygote.spawn(config, log, env=env_without_aws())
    assert wait_for_event(run_dir, child, lambda e: e["event"] == "step" and e["step"] >= 2) is not None
    moto.pause()
    try:
        child.signal(signal.SIGTERM)
        stop = wait_for_event(run_dir, child, lambda e: e["event"] == "preempted")
        assert stop is not None, log.read_text()[-3000:]
        time.sleep(1.5)   # past the window in which a repeat counts as the same request
        child.signal(signal.SIGTERM)
        time.sleep(0.5)
    finally:
        moto.resume()
    assert child.wait() == exitcodes.STOPPED_SAVED, log.read_text()[-3000:]
    name = f"step-{stop['step']:08d}"
    assert f"team/runs/twice/checkpoints/{name}/manifest.json" in moto.keys(bucket)
    assert "already stopping" in log.read_text()


def test_sigterm_during_start_up_stops_cleanly(fast_inputs, tmp_path):
    """Item 4: the studio's Stop (control/stop, then SIGTERM) while the trainer is still importing:
    exit 75 and a `stopped` event, which the studio shows as stopped (it used to die of SIGTERM)."""
    from gui.run_state import run_status
    config = write_config(tmp_path / "s.toml", *fast_inputs, tmp_path / "runs", "early")
    run_dir = tmp_path / "runs" / "early"
    with open(tmp_path / "s.log", "wb") as out:
        proc = subprocess.Popen([PY, "-m", "trainer_backend", "train", "--config", str(config)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, env=child_env())
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / ".sd-studio-run").exists():   # the run folder is claimed before the slow imports
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "s.log").read_text()
            time.sleep(0.02)
        (run_dir / "control").mkdir(exist_ok=True)
        (run_dir / "control" / "stop").write_text("")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == exitcodes.STOPPED_SAVED, (tmp_path / "s.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    kinds = [e["event"] for e in read_events(run_dir)]
    assert kinds[-1] == "stopped" and "step" not in kinds
    assert "Traceback" not in (tmp_path / "s.log").read_text()
    assert run_status(run_dir).status == "stopped"


def _record_durability(monkeypatch) -> list[tuple[str, str]]:
    """(op, path) for every fsync and rename, in order."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        calls.append(("rename", str(dst)))
        return real_replace(src, dst)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_checkpoint_files_and_folders_reach_the_disk_before_the_manifest(monkeypatch, tmp_path):
    """Item 5: after a power loss, a checkpoint that has its manifest has all its files: every file
    and every folder (nested ones too) is fsynced before manifest.json gets its name, and the
    checkpoints folder after the rename that makes the checkpoint exist."""
    from trainer_backend.run.checkpoint_files import TrainState, _finalise, is_valid
    root = tmp_path / "run" / "checkpoints"
    tmp = root / ".tmp-step-00000003"
    (tmp / "sub" / "deeper").mkdir(parents=True)
    (tmp / "optimizer.bin").write_bytes(b"o" * 100)
    (tmp / "sub" / "deeper" / "shard.bin").write_bytes(b"s" * 10)
    calls = _record_durability(monkeypatch)
    _finalise(tmp, root / "step-00000003", TrainState(global_step=3), {}, "steps")
    manifest_at = calls.index(("rename", str(tmp / "manifest.json")))
    synced = {path for op, path in calls[:manifest_at] if op == "fsync"}
    for path in [tmp, tmp / "sub", tmp / "sub" / "deeper", tmp / "optimizer.bin", tmp / "sub" / "deeper" / "shard.bin",
                 tmp / "trainer_state.json"]:
        assert str(path) in synced, f"{path} was not fsynced before the manifest"
    final_at = calls.index(("rename", str(root / "step-00000003")))
    assert ("fsync", str(root)) in calls[final_at:]
    assert is_valid(root / "step-00000003", verify_hashes=True)


def test_latent_cache_files_are_on_disk_before_they_get_their_name(monkeypatch, tmp_path):
    """Item 5: a latent cache file is whole or absent after a kill or a power loss."""
    import torch
    from trainer_backend.data.cache import DiskLatents
    cache = DiskLatents(tmp_path / "cache")
    calls = _record_durability(monkeypatch)
    cache.save("abcdef", torch.ones(4, 8, 8))
    target = cache.path("abcdef")
    renamed = calls.index(("rename", str(target)))
    assert [op for op, _ in calls[:renamed]] == ["fsync"] and calls[0][1].endswith(".tmp")
    assert torch.equal(cache.load("abcdef"), torch.ones(4, 8, 8))
    assert [p.name for p in target.parent.iterdir()] == [target.name]


@pytest.mark.parametrize("case", ["target modules match nothing", "huge N_concept"])
def test_bad_input_is_one_line_and_exit_2(zygote, fast_inputs, tmp_path, case):
    """Item 15: adapter targets that match no layer, and a `99999999999999999999_concept` folder:
    one line naming the key, exit 2, no traceback (they used to end in a traceback and exit 1)."""
    from conftest import make_dataset
    model_dir, data_dir = fast_inputs
    if case == "huge N_concept":
        make_dataset(tmp_path / "data" / "99999999999999999999_concept", n=2, size=32)
        extra, key = {"dataset": {"path": str(tmp_path / "data")}}, "dataset.path"
    else:
        extra, key = {"network": {"target_modules": ["to_nowhere"]}}, "network.target_modules"
    config = write_config(tmp_path / "b.toml", model_dir, data_dir, tmp_path / "runs", "bad", extra)
    log = tmp_path / "b.log"
    assert zygote.run(config, log) == exitcodes.BAD_CONFIG, log.read_text()[-3000:]
    errors = _error_lines(log)
    assert len(errors) == 1 and errors[0].startswith(f"error: {key}:"), log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


def test_deeply_nested_metadata_json_is_skipped_not_fatal(tmp_path):
    """Item 15: one metadata file nested 100 000 levels deep is reported and skipped; the others load."""
    from conftest import make_dataset
    from trainer_backend.config import from_dict
    from trainer_backend.data import scan_dataset
    data = make_dataset(tmp_path / "data", n=2, size=32)
    (data / "good.json").write_text('[{"path": "img000.png", "tags": ["a"]}, {"path": "img001.png", "tags": ["b"]}]')
    (data / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    cfg = from_dict({"dataset": {"path": str(data), "source": "metadata", "resolution": 32, "bucket_min_side": 16}})
    scan = scan_dataset(cfg)
    assert len(scan.items) == 2
    assert any("deep.json" in w and "nested too deeply" in w for w in scan.warnings), scan.warnings
