"""Disk full at the end of a run (issue 37 item 11): events.jsonl never holds half a line, a
train.log that cannot be written is one warning (no logging traceback), and the final LoRA export
gets the checkpoint's treatment: the path, the free space, what to do; no partial file is left.
The full disk is a file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as ENOSPC would)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

from checkpoint_harness import fast_inputs, read_events, reference_run, write_config, zygote  # noqa: F401
from conftest import ROOT
from trainer_backend.run.checkpoint_files import checkpoints_dir

EVENTS_UNDER_A_LIMIT = r"""
import logging, resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
from trainer_backend.run.events import RunEvents, setup_logging
run = Path(sys.argv[1])
setup_logging(run, True)
events = RunEvents(run, tensorboard=False)
for step in range(1, 200):
    events.emit("step", step=step, loss=0.5, note="x" * 37)
    logging.getLogger("trainer").info("step %d %s", step, "y" * 50)
events.close()
print("finished")
"""


def test_events_lines_are_whole_and_a_full_log_is_one_warning(tmp_path):
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-c", EVENTS_UNDER_A_LIMIT, str(run)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "finished" in out.stdout, out.stderr[-2000:]
    raw = (run / "events.jsonl").read_bytes()
    assert raw.endswith(b"\n") and 2000 < len(raw) <= 3000
    steps = [json.loads(line)["step"] for line in raw.decode().splitlines()]  # every line parses
    assert steps == list(range(1, len(steps) + 1))
    assert "Traceback" not in out.stderr and "Logging error" not in out.stderr
    assert out.stderr.count("cannot write the log") == 1 and out.stderr.count("cannot append events") == 1


def test_disk_full_at_the_final_export_says_where_and_what_to_do(zygote, reference_run, fast_inputs, tmp_path):
    """The reference run's final checkpoint resumed: nothing to train, only the export, which the
    file-size limit cuts short."""
    run = tmp_path / "runs" / "full"
    src = checkpoints_dir(reference_run["run_dir"]) / "step-00000012"
    shutil.copytree(src, checkpoints_dir(run) / src.name)
    lora_size = (reference_run["run_dir"] / "reference.safetensors").stat().st_size
    config = write_config(tmp_path / "f.toml", *fast_inputs, tmp_path / "runs", "full")
    log = tmp_path / "f.log"
    assert zygote.run(config, log, fsize=lora_size // 2) == 1
    errors = [e for e in read_events(run) if e["event"] == "error"]
    assert len(errors) == 1, log.read_text()[-3000:]
    message = errors[0]["message"]
    assert message.startswith(f"OutputWriteError: could not write the outputs in {run}")
    assert "File too large" in message and "MB free on that disk" in message, message
    assert f"the last checkpoint {checkpoints_dir(run) / 'step-00000012'} is intact" in message
    assert "start the run again" in message
    assert not [p.name for p in run.iterdir() if p.name.startswith("full")]  # no partial output left
    for line in (run / "events.jsonl").read_text().splitlines():
        json.loads(line)
    text = log.read_text()
    assert "Traceback" not in text and text.count("error: OutputWriteError") == 1


def test_a_failed_output_write_removes_only_what_it_left_half_written(tmp_path):
    import errno

    import pytest

    from trainer_backend.run.output_writes import OutputWriteError, written_or_explained
    (tmp_path / "notes.txt").write_text("the user's")
    (tmp_path / "lora-step00000004.safetensors").write_bytes(b"an earlier export")

    def write():
        (tmp_path / "lora.safetensors").write_bytes(b"half a fi")
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OutputWriteError, match=r"No space left on device; [\d,]+ MB free on that disk; removed the "
                                               r"partial lora.safetensors\); no checkpoint was kept"):
        written_or_explained(tmp_path, "lora", write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora-step00000004.safetensors", "notes.txt"]

    def broken():
        raise ValueError("not a disk problem")
    with pytest.raises(ValueError, match="not a disk problem"):
        written_or_explained(tmp_path, "lora", broken)
