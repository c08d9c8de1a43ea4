"""Training jobs: a config checked when it is submitted (every problem as key + message, the checks
`validate`, `train` and the form run), and, when a slot frees, its run folder written and its
command built for exactly the GPUs the queue gave it, under the run folder's lock. The Run page's
Start/Resume start their runs through `start_run` too."""
from __future__ import annotations

import json
import os
import subprocess
import time
import tomllib
from pathlib import Path

from trainer_backend.config import ConfigError, TrainConfig, dumps_toml, from_dict, save_toml, to_dict
from trainer_backend.config.base import Problem
from trainer_backend.config.io import overlay
from trainer_backend.run.contract import COMMAND_FILE, CONFIG_FILE, CONSOLE_LOG, EXIT_FILE
from trainer_backend.run.run_lock import acquire as acquire_run_lock, describe as describe_holder

from . import processes as procs
from .slots import CPU


def _problem(error: Exception, key: str = "config_toml") -> Problem:
    """A ConfigError's one line ("section.key: message") as a Problem."""
    text = str(error)
    head, sep, rest = text.partition(": ")
    if sep and " " not in head and head:
        return Problem(head, rest)
    return Problem(key, text)


def outside_roots(run_dir: Path, allowed_roots: list[Path]) -> Problem | None:
    """Jobs write only inside --runs-dir and the --allow-output-dir folders."""
    if any(run_dir == root or run_dir.is_relative_to(root) for root in allowed_roots):
        return None
    roots = ", ".join(str(r) for r in allowed_roots)
    return Problem("output.dir", f"{run_dir.parent} is outside the folders this studio writes runs into ({roots}); "
                                 f"choose one of them, or start the studio with --allow-output-dir {run_dir.parent}")


def check_config(config_toml: str, base: dict, allowed_roots: list[Path], cwd: Path
                 ) -> tuple[TrainConfig | None, list[Problem]]:
    """TOML text over the studio's defaults -> (the complete config with output.dir absolute, every
    problem). The problems are those Start and `validate` report (config/checks.py run_problems)."""
    from trainer_backend.config.checks import run_problems
    try:
        data = tomllib.loads(config_toml)
    except tomllib.TOMLDecodeError as e:
        return None, [Problem("config_toml", f"not valid TOML: {e}")]
    try:
        cfg = from_dict(overlay(base, data))
        cfg.output.dir = str((cwd / cfg.output.dir).resolve())
    except (ConfigError, OSError) as e:
        return None, [_problem(e)]
    found = []
    outside = outside_roots(cfg.run_dir, allowed_roots)
    if outside:
        found.append(outside)
    found += run_problems(cfg.model_copy(deep=True))
    return cfg, found


def gpus_wanted(cfg: TrainConfig, gpu_slots: list[str]) -> int:
    from .slots import wanted
    return wanted(gpu_slots, cfg.hardware.num_processes, cfg.hardware.cpu)


def on_slots(cfg: TrainConfig, slots: list[str]) -> TrainConfig:
    """The config the job runs with: its GPUs are exactly the slots it was given (the trainer's
    CUDA_VISIBLE_DEVICES comes from hardware.gpu_ids; the step plan uses num_processes = N)."""
    cfg = cfg.model_copy(deep=True)
    gpus = [s for s in slots if s != CPU]
    if gpus:
        cfg.hardware.gpu_ids = ",".join(gpus)
        cfg.hardware.num_processes = len(gpus)
    return cfg


def start_run(cfg: TrainConfig, python: str, cwd: Path, by: str, who: str, resume: bool = False,
              secret_env: dict[str, str] | None = None) -> subprocess.Popen:
    """Take the run folder's lock (refused with one line naming the holder), write what a run
    starts from (config, strategy files, command), start the trainer in its own process group and
    hand it the lock. Secrets reach its environment only. The page's Start and the queue call this."""
    from trainer_backend.launch.argv import build_launch_argv, build_launch_env, write_strategy_files
    run_dir = cfg.run_dir
    with acquire_run_lock(run_dir, by=by) as lock:   # a new folder or a run's own, held by no other trainer
        config_path = run_dir / CONFIG_FILE
        save_toml(to_dict(cfg), config_path)          # secrets are stripped by save_toml
        write_strategy_files(cfg, run_dir)
        argv = build_launch_argv(cfg, config_path, python=python)
        env = {**os.environ, **(secret_env or {}), **build_launch_env(cfg), "PYTHONUNBUFFERED": "1",
               **lock.child_env()}
        (run_dir / COMMAND_FILE).write_text(json.dumps(argv), encoding="utf-8")
        procs.clear_control(run_dir)
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
        with open(run_dir / CONSOLE_LOG, "a", encoding="utf-8") as console:
            console.write(f"--- {'resumed' if resume else 'started'} by {who} at "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
            if lock.stale:   # the run's last trainer crashed or was killed holding it (run/run_lock.py)
                console.write(f"note: the run was left locked by {describe_holder(lock.stale)}, which ended "
                              "without releasing it; this start took it over\n")
        child = procs.spawn(argv, env, run_dir, cwd=cwd, pass_fds=lock.pass_fds())
        lock.handed_to(child.pid)   # the trainer's launcher holds it while it lives
    return child


def start_command(argv: list[str], env: dict[str, str], run_dir: Path) -> subprocess.Popen:
    """A prepared command (caption job, LoRA tool) in its own folder, under the folder's lock."""
    with acquire_run_lock(run_dir, by="queue") as lock:
        child = procs.spawn(argv, {**env, **lock.child_env()}, run_dir, cwd=run_dir, pass_fds=lock.pass_fds())
        lock.handed_to(child.pid)
    return child


def training_config(job_config_toml: str) -> TrainConfig:
    return from_dict(tomllib.loads(job_config_toml))


def stored_toml(cfg: TrainConfig) -> str:
    """What the queue keeps of a submitted config: the complete config, never its secrets."""
    from trainer_backend.config.io import strip_secrets
    return dumps_toml(strip_secrets(to_dict(cfg)))
