"""SIGTERM/SIGINT: the run finishes the optimizer step in progress, saves a checkpoint, reports
`preempted` (or `stopped` when the GUI asked), exits 75, and a resume continues at the next
step; a second signal exits at once; on two ranks both stop at the same step."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from checkpoint_harness import (PY, ROOT, assert_bitwise_equal, child_env, fast_inputs, lora_tensors,  # noqa: F401
                                read_events, reference_run, valid_steps, wait_for_event, write_config, zygote)
from conftest import free_port
from trainer_backend.run import exitcodes


def _stop_at(zygote, run_dir, config, log, after_step: int, user: bool) -> tuple[int, int, list[dict]]:
    """Start (or resume) the run, send SIGTERM once step `after_step` of this segment is
    reported; returns (last step seen before the signal, exit code, this segment's events)."""
    since = len(read_events(run_dir))
    child = zygote.spawn(config, log)
    ev = wait_for_event(run_dir, child, lambda e: e["event"] == "step" and e["step"] >= after_step, since)
    assert ev is not None, log.read_text()[-3000:]
    if user:
        (run_dir / "control" / "stop").write_text("")
    seen = max(e["step"] for e in read_events(run_dir)[since:] if e["event"] == "step")
    child.signal(signal.SIGTERM)
    return seen, child.wait(), read_events(run_dir)[since:]


def test_sigterm_saves_within_one_step_and_resume_continues(zygote, reference_run, fast_inputs, tmp_path):
    config = write_config(tmp_path / "term.toml", *fast_inputs, tmp_path / "runs", "term",
                          {"checkpoints": {"every_n_steps": 0, "keep_every_n_steps": 0}})
    run_dir, log = tmp_path / "runs" / "term", tmp_path / "console.log"

    # a preemption: SIGTERM with no stop mark from the GUI
    seen, rc, events = _stop_at(zygote, run_dir, config, log, 3, user=False)
    assert rc == exitcodes.STOPPED_SAVED, log.read_text()[-3000:]
    kinds = [e["event"] for e in events]
    assert "preempted" in kinds and "stopped" not in kinds and "done" not in kinds
    stopped_at = events[kinds.index("preempted")]["step"]
    assert seen <= stopped_at <= seen + 1, "the run went on past the step in progress"
    assert max(e["step"] for e in events if e["event"] == "step") == stopped_at
    checkpoint = [e for e in events if e["event"] == "checkpoint"][-1]
    assert checkpoint["step"] == stopped_at and checkpoint["trigger"] == "stop"
    assert valid_steps(run_dir) == [stopped_at]  # no periodic checkpoints in this config: the stop saved it

    # resumed: continues at the next step; then the user presses Stop (mark file + SIGTERM)
    seen, rc, events = _stop_at(zygote, run_dir, config, log, stopped_at + 2, user=True)
    assert rc == exitcodes.STOPPED_SAVED
    assert [e["step"] for e in events if e["event"] == "step"][0] == stopped_at + 1
    assert "stopped" in [e["event"] for e in events] and "preempted" not in [e["event"] for e in events]
    second_stop = [e for e in events if e["event"] == "stopped"][0]["step"]

    # and to the end: the same weights as the run that was never interrupted
    since = len(read_events(run_dir))
    assert zygote.run(config, log) == 0, log.read_text()[-3000:]
    events = read_events(run_dir)[since:]
    assert [e["step"] for e in events if e["event"] == "step"][0] == second_stop + 1
    assert_bitwise_equal(lora_tensors(run_dir / "term.safetensors"), reference_run["lora"])


SIGNAL_SCRIPT = r"""
import os, signal, sys, time
from trainer_backend.run.stop_signals import StopSignals
stops = StopSignals(sys.argv[1])
os.kill(os.getpid(), signal.SIGTERM)   # a launcher forwarding the signal it got
os.kill(os.getpid(), signal.SIGINT)    # ...arrives twice within a moment: one request
print("after two quick signals: stop requested =", stops.stop_requested, flush=True)
time.sleep(1.5)
os.kill(os.getpid(), signal.SIGTERM)   # a second request: exit now
time.sleep(30)
print("still running", flush=True)
"""


def test_second_signal_exits_at_once(tmp_path):
    r = subprocess.run([PY, "-c", SIGNAL_SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=child_env())
    assert r.stdout.splitlines() == ["after two quick signals: stop requested = True"], r.stderr[-2000:]
    assert r.returncode == 130
    assert "second stop signal" in r.stderr


def _rank_pids(launcher: psutil.Process) -> dict[int, int]:
    ranks = {}
    for p in launcher.children(recursive=True):
        try:
            rank = p.environ().get("RANK")
            if rank is not None and "trainer_backend" in " ".join(p.cmdline()):
                ranks[int(rank)] = p.pid
        except psutil.Error:
            continue
    return ranks


@pytest.mark.both_cores
def test_two_ranks_stop_at_the_same_step(fast_inputs, tmp_path):
    """SIGTERM reaches rank 1 only: both ranks stop after the same step (the flags are summed
    over the ranks after every step), the checkpoint holds both ranks' RNG states, nobody
    hangs, and the run resumes on two ranks to the end."""
    model_dir, data_dir = fast_inputs
    config = write_config(tmp_path / "two.toml", model_dir, data_dir, tmp_path / "runs", "two",
                          {"hardware": {"num_processes": 2, "main_process_port": free_port()},
                           "checkpoints": {"every_n_steps": 0, "keep_every_n_steps": 0}})
    run_dir, log = tmp_path / "runs" / "two", tmp_path / "console.log"
    cmd = [PY, "-m", "trainer_backend", "launch", "--config", str(config)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=child_env())
    launcher = psutil.Process(proc.pid)
    deadline = time.monotonic() + 300
    while not any(e["event"] == "step" and e["step"] >= 2 for e in read_events(run_dir)):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    ranks = _rank_pids(launcher)
    assert set(ranks) == {0, 1}
    os.kill(ranks[1], signal.SIGTERM)
    assert proc.wait(timeout=300) == exitcodes.STOPPED_SAVED, log.read_text()[-3000:]

    events = read_events(run_dir)
    stop = [e for e in events if e["event"] == "preempted"]
    assert len(stop) == 1
    step = stop[0]["step"]
    assert valid_steps(run_dir) == [step]
    folder = run_dir / "checkpoints" / f"step-{step:08d}"
    assert (folder / "random_states_0.pkl").is_file() and (folder / "random_states_1.pkl").is_file()
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["global_step"] == step and state["num_processes"] == 2

    since = len(events)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=child_env())
    assert r.returncode == 0, r.stderr[-3000:]
    after = read_events(run_dir)[since:]
    assert [e["step"] for e in after if e["event"] == "step"][0] == step + 1
    assert (run_dir / "two.safetensors").is_file()
