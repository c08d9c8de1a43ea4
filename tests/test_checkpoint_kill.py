"""Kill tests: a run SIGKILLed at random points and resumed with resume = "auto" each time ends
with a LoRA bitwise equal to the uninterrupted run's; no incomplete folder is ever chosen, and
retention holds after every restart.

The fast config (checkpoints_fast.py) has adapter dropout (the RNG state must be restored), a
cosine schedule with warmup (the scheduler state must be restored), 4 images (resumes land
mid-epoch and on epoch boundaries) and a checkpoint every step with keep_last=2 plus every 4th
step kept forever. The killed runs are 24 steps long and every kill lands at least 12 steps
before the end, so even on a fast machine the run cannot finish before the kill arrives.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from checkpoint_harness import (PY, ROOT, assert_bitwise_equal, fast_inputs, lora_tensors, read_events,  # noqa: F401
                                child_env, valid_steps, wait_for_event, write_config, zygote)
from trainer_backend.run.checkpoint_files import checkpoints_dir, read_manifest
from trainer_backend.run.retention import RetentionPolicy, retained_steps

POLICY = RetentionPolicy(keep_last=2, keep_every=4)
LEFTOVER = "left-by-the-kill"
TOTAL = 24
LONG = {"schedule": {"max_steps": TOTAL}}


def _retention_holds(run_dir, allow_unpruned_newest: bool = False) -> bool:
    steps = valid_steps(run_dir)
    infos = [(s, (read_manifest(checkpoints_dir(run_dir) / f"step-{s:08d}") or {}).get("metrics", {}))
             for s in steps]
    if retained_steps(infos, POLICY) == set(steps):
        return True
    # a kill between writing a checkpoint and pruning leaves one checkpoint too many
    return allow_unpruned_newest and retained_steps(infos[:-1], POLICY) == set(steps[:-1])


def _kill_and_resume(zygote, tmp_path, config, run_dir, kills: int, seed: int):
    rng = random.Random(seed)
    log = tmp_path / "console.log"
    done_kills = 0
    while True:
        since = len(read_events(run_dir))
        before = valid_steps(run_dir)
        child = zygote.spawn(config, log)
        start = wait_for_event(run_dir, child, lambda e: e["event"] == "start", since)
        assert start is not None, log.read_text()[-3000:]
        resumed = [e for e in read_events(run_dir)[since:] if e["event"] == "resumed"]
        # the newest complete checkpoint at the time of the kill, nothing else, is resumed
        if before:
            assert resumed and resumed[0]["step"] == before[-1], (before, resumed)
            assert resumed[0]["path"].endswith(f"step-{before[-1]:08d}")
        else:
            assert not resumed and start["step"] == 0
        # what the kill left half-written is gone (the new process may already be writing anew)
        assert not list(checkpoints_dir(run_dir).glob(f"*/{LEFTOVER}")), "a temporary folder survived the restart"
        assert not (checkpoints_dir(run_dir) / "step-99999999").exists()
        if done_kills == kills:
            assert child.wait() == 0, log.read_text()[-3000:]
            return
        target = min(TOTAL - 12, start["step"] + rng.randint(1, 2))
        ev = wait_for_event(run_dir, child, lambda e: e["event"] == "step" and e["step"] >= target, since)
        assert ev is not None, log.read_text()[-3000:]
        if rng.random() < 0.7:  # also land inside the checkpoint write or the step that follow
            time.sleep(rng.uniform(0.0, 0.15))
        child.signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
        done_kills += 1
        assert _retention_holds(run_dir, allow_unpruned_newest=True), valid_steps(run_dir)
        for folder in checkpoints_dir(run_dir).glob(".*"):
            (folder / LEFTOVER).write_text("")
            print(f"kill {done_kills} left {folder.name} half-written")
        if done_kills == 2:
            # a folder that looks newest but has no manifest (a write cut short) is never chosen
            fake = checkpoints_dir(run_dir) / "step-99999999"
            fake.mkdir(parents=True)
            (fake / "adapter_unet.safetensors").write_bytes(b"\0" * 100)


@pytest.fixture(scope="module")
def long_reference(zygote, fast_inputs, tmp_path_factory) -> dict:
    """The 24-step config run once without interruption."""
    root = tmp_path_factory.mktemp("kill-reference")
    config = write_config(root / "reference.toml", *fast_inputs, root / "runs", "reference", LONG)
    assert zygote.run(config, root / "console.log") == 0, (root / "console.log").read_text()[-3000:]
    run_dir = root / "runs" / "reference"
    return {"lora": lora_tensors(run_dir / "reference.safetensors"), "steps": valid_steps(run_dir)}


def _killed_run(fast_inputs, tmp_path):
    """The 24-step config in a fresh run dir, and the kill seed (KILL_SEED replays a failure)."""
    config = write_config(tmp_path / "killed.toml", *fast_inputs, tmp_path / "runs", "killed", LONG)
    seed = int(os.environ.get("KILL_SEED", random.randrange(1 << 30)))
    print(f"KILL_SEED={seed}")
    return config, tmp_path / "runs" / "killed", seed


def test_sigkill_at_random_points_resumes_bitwise(zygote, long_reference, fast_inputs, tmp_path):
    reference_run = long_reference
    config, run_dir, seed = _killed_run(fast_inputs, tmp_path)
    _kill_and_resume(zygote, tmp_path, config, run_dir, kills=5, seed=seed)

    assert_bitwise_equal(lora_tensors(run_dir / "killed.safetensors"), reference_run["lora"])
    assert valid_steps(run_dir) == reference_run["steps"]  # the same checkpoints survive as uninterrupted
    assert _retention_holds(run_dir)
    steps = [e["step"] for e in read_events(run_dir) if e["event"] == "step"]
    assert max(steps) == TOTAL and set(steps) == set(range(1, TOTAL + 1))


@pytest.mark.slow
def test_many_sigkills_with_plain_subprocesses(long_reference, fast_inputs, tmp_path):
    """The same with real `python -m trainer_backend train` processes (no zygote), 10 kills."""
    reference_run = long_reference
    config, run_dir, seed = _killed_run(fast_inputs, tmp_path)

    class Plain:  # the zygote interface over subprocess.Popen
        def spawn(self, cfg, log):
            out = open(log, "ab")
            proc = subprocess.Popen([PY, "-m", "trainer_backend", "train", "--config", str(cfg)], cwd=ROOT,
                                    stdout=out, stderr=subprocess.STDOUT, env=child_env())
            proc.signal, proc.wait_rc = proc.send_signal, proc.wait

            class C:
                pid = proc.pid
                signal = staticmethod(proc.send_signal)
                wait = staticmethod(lambda: proc.wait())
            return C

    _kill_and_resume(Plain(), tmp_path, config, run_dir, kills=10, seed=seed)
    assert_bitwise_equal(lora_tensors(run_dir / "killed.safetensors"), reference_run["lora"])
    assert valid_steps(run_dir) == reference_run["steps"]


# ----------------------------------------------------------------------------- two ranks (DDP)

TWO_RANKS = {"hardware": {"num_processes": 2}, "schedule": {"max_steps": 48}}  # 24 steps of 2 ranks


class _Launch:
    """`python -m trainer_backend launch` (accelerate launch → torch's elastic agent → 2 gloo
    ranks) in its own process group, so a kill can take one rank or the whole machine."""

    def __init__(self, config, log):
        self.proc = subprocess.Popen([PY, "-m", "trainer_backend", "launch", "--config", str(config)], cwd=ROOT,
                                     stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=child_env(),
                                     start_new_session=True)
        self.pid = self.proc.pid

    def tree(self) -> list[int]:
        """This launch's live processes: the launcher and its descendants (torch's elastic agent
        starts each rank in a session of its own, so the process group does not hold them)."""
        parents = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                parents[int(stat.parent.name)] = int(fields[1])
        tree, grew = {self.pid} & parents.keys(), True
        while grew:
            more = {p for p, parent in parents.items() if parent in tree} - tree
            tree |= more
            grew = bool(more)
        return sorted(tree)

    def ranks(self) -> list[int]:
        """The training processes: those with a LOCAL_RANK in their environment."""
        found = []
        for pid in self.tree():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(v.startswith(b"LOCAL_RANK=") for v in env):
                found.append(pid)
        return found

    def wait(self, timeout: float = 300) -> int:
        return self.proc.wait(timeout=timeout)


@pytest.mark.both_cores
def test_sigkill_with_two_ranks_resumes_bitwise(fast_inputs, tmp_path):
    """Two CPU ranks under DDP: one rank SIGKILLed (the OOM killer's way), later the whole process
    group (a lost machine); each restart with resume = "auto" continues from the newest complete
    checkpoint, and the final LoRA is bitwise the uninterrupted two-rank run's."""
    reference = write_config(tmp_path / "ref.toml", *fast_inputs, tmp_path / "runs", "ref", TWO_RANKS)
    assert _Launch(reference, tmp_path / "ref.log").wait(600) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    ref_dir = tmp_path / "runs" / "ref"

    config = write_config(tmp_path / "killed.toml", *fast_inputs, tmp_path / "runs", "killed", TWO_RANKS)
    run_dir, log = tmp_path / "runs" / "killed", tmp_path / "killed.log"
    for how, at_step in (("one rank", 3), ("process group", 9)):
        since = len(read_events(run_dir))
        before = valid_steps(run_dir)
        launch = _Launch(config, log)
        ev = wait_for_event(run_dir, launch, lambda e: e["event"] == "step" and e["step"] >= at_step, since)
        assert ev is not None, log.read_text()[-3000:]
        resumed = [e for e in read_events(run_dir)[since:] if e["event"] == "resumed"]
        assert [e["step"] for e in resumed] == before[-1:], (before, resumed)
        if how == "one rank":
            ranks = launch.ranks()
            assert len(ranks) == 2, ranks
            os.kill(ranks[-1], signal.SIGKILL)
            assert launch.wait() != 0  # the elastic agent takes the other rank down and fails the launch
        else:  # the machine is gone: every process of the launch at once
            for pid in launch.tree():
                os.kill(pid, signal.SIGKILL)
            launch.wait()
        for _ in range(100):
            if not launch.tree():
                break
            time.sleep(0.1)
        assert not launch.tree(), "a process of the killed launch survived"

    since = len(read_events(run_dir))
    last = valid_steps(run_dir)[-1]
    assert _Launch(config, log).wait(600) == 0, log.read_text()[-3000:]
    assert [e["step"] for e in read_events(run_dir)[since:] if e["event"] == "resumed"] == [last]
    assert_bitwise_equal(lora_tensors(run_dir / "killed.safetensors"), lora_tensors(ref_dir / "ref.safetensors"))
    steps = [e["step"] for e in read_events(run_dir) if e["event"] == "step"]
    total = [e for e in read_events(ref_dir) if e["event"] == "plan"][0]["multi"]["total_steps"]
    assert total == 24 and set(steps) == set(range(1, total + 1))

