"""CLI: python -m trainer_backend train|launch|validate|plan|inspect|make-tiny-model|dataset|caption|download|lora|clips.

Exit codes: 0 ok, 1 error, 2 bad config or input (one line on stderr naming the key or
file), 75 stopped with state saved (see exitcodes.py).
"""
from __future__ import annotations

import argparse
import json
import sys

from .run import exitcodes
from .run.contract import Event
from .config import ConfigError, load_config
from .families.registry import FAMILY_NAMES
from .captioners.cli import add_parser as add_caption_parser
from .captioners.kinds import TINY_ARCHS


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML config (sparse preset or complete run config)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one option; repeatable")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer_backend", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _config_args(sub.add_parser("train", help="train in this process (or under `accelerate launch`)"))
    launch = sub.add_parser("launch", help="start `accelerate launch` for the config's hardware section")
    _config_args(launch)
    launch.add_argument("--dry-run", action="store_true", help="print the argv instead of running it")
    _config_args(sub.add_parser("validate", help="check a config and its paths"))
    plan = sub.add_parser("plan", help="print the step plan for 1 and N processes")
    _config_args(plan)
    plan.add_argument("--num-processes", type=int, default=None)
    plan.add_argument("--json", action="store_true")
    _config_args(sub.add_parser("inspect", help="dataset summary and counts as JSON"))
    from .lora_tools.cli import add_parser as add_lora_parser
    add_lora_parser(sub)  # lora merge|mix|resize|extract|ema|inspect (lora_tools/)
    ref = sub.add_parser("config-reference", help="print the config reference, or regenerate the generated "
                         "blocks of a doc (--write: docs/config.md; --write docs/checkpoints.md)")
    ref.add_argument("--write", metavar="DOC", nargs="?", const="docs/config.md", default=None)
    tiny = sub.add_parser("make-tiny-model", help="build a tiny random model (diffusers folder) for tests/demo")
    tiny.add_argument("--arch", choices=[*FAMILY_NAMES, *TINY_ARCHS], required=True)
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--seed", type=int, default=0)
    from .workbench.cli import add_parser as add_dataset_parser
    add_dataset_parser(sub)   # dataset check|edit|undo|index (the workbench)
    add_caption_parser(sub)
    from .model_sources.cli import add_parser as add_download
    add_download(sub)
    from .data.video_cli import add_parser as add_clips
    add_clips(sub)            # clips FOLDER (video datasets)
    return parser


def _load(args):
    from .config.checks import validate_dataset_only, validate_for_run
    cfg = load_config(args.config, args.overrides)
    if args.command in ("plan", "inspect"):  # need only the dataset (the GUI inspects before a model is set)
        return validate_dataset_only(cfg)
    return validate_for_run(cfg)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "dataset":
        from .workbench.cli import run as run_dataset
        return run_dataset(args)
    if args.command != "train":
        return _checked(args)
    # SIGTERM/SIGINT before the loop takes the signals over (imports, model loading) or after it
    # gave them back: a clean `stopped`/`preempted` and exit 75, never a bare "killed by SIGTERM"
    from .run.stop_signals import StartupStop, stop_outside_the_loop
    with stop_outside_the_loop():
        try:
            return _checked(args)
        except StartupStop as stop:
            return _stopped_outside_the_loop(getattr(args, "loaded_config", None), stop.signum)


def _checked(args) -> int:
    try:
        return _dispatch(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        if args.command == "plan":   # memory does not depend on the dataset: say it anyway
            _memory_without_dataset(args)
        cfg = getattr(args, "loaded_config", None)
        from .run.run_lock import RunLocked
        if cfg is not None and args.command == "train" and not isinstance(e, RunLocked):  # not another's run
            _record_event(cfg, Event.ERROR, message=str(e))  # the studio shows why (only in a run's own folder)
        return exitcodes.BAD_CONFIG


def _dispatch(args) -> int:
    if args.command == "lora":
        from .lora_tools.cli import run as run_lora
        return run_lora(args)
    if args.command == "download":
        from .model_sources.cli import run as download
        return download(args)
    if args.command == "clips":
        from .data.video_cli import run as clips
        return clips(args)
    if args.command == "caption":
        from .captioners.cli import run as caption
        return caption(args)
    if args.command == "make-tiny-model" and args.arch in TINY_ARCHS:
        from .captioners import build_tiny_captioner
        print(build_tiny_captioner(args.arch.removeprefix("caption-"), args.out, seed=args.seed))
        return exitcodes.OK
    if args.command == "make-tiny-model":
        from .families import build_tiny_model
        print(build_tiny_model(args.arch, args.out, seed=args.seed))
        return exitcodes.OK
    if args.command == "config-reference":
        from .config.reference import config_reference, write_into
        if args.write:
            from pathlib import Path
            try:
                write_into(Path(args.write))
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return exitcodes.BAD_CONFIG
        else:
            print(config_reference())
        return exitcodes.OK
    if args.command == "validate":  # every problem at once (paths, rules, methods), one line each
        from .config.checks import run_problems
        found = run_problems(load_config(args.config, args.overrides))
        if found:
            for problem in found:
                print(f"error: {problem}", file=sys.stderr)
            return exitcodes.BAD_CONFIG
    cfg = _load(args)
    args.loaded_config = cfg
    if args.command == "validate":
        print(f"ok: {args.config or 'defaults'} is valid")
        return exitcodes.OK
    if args.command in ("plan", "inspect"):
        from .data import scan_dataset
        from .data.video_items import planned_video_options
        scan = scan_dataset(cfg, video=planned_video_options(cfg))  # a video family's clips count too
        if args.command == "inspect":
            from dataclasses import asdict
            print(json.dumps({"summary": scan.summary, "counts": asdict(scan.counts)}, default=str))
            return exitcodes.OK
        from .config.caching import auto_caching, with_auto_caching
        caching = auto_caching(cfg)
        cfg = with_auto_caching(cfg)  # what the trainer will cache (the memory plan counts it)
        from .launch.plan import format_plan_table, plan_from_config
        plan = plan_from_config(cfg, scan.counts, args.num_processes)
        from .launch.memory_advice import memory_lines, memory_report
        arch = _plan_arch(cfg)
        column = plan.multi if plan.num_processes > 1 else plan.single  # the run's optimizer steps
        from .model_sources import plan_lines
        downloads = plan_lines(cfg)  # hub models: the download size and the free space
        if args.json:
            print(json.dumps({**plan.to_dict(), "downloads": downloads, "caching": caching.to_dict(), "memory": memory_report(cfg, arch, scan.buckets,
                                                                        steps=column.total_steps)}, indent=1))
        else:
            print(format_plan_table(plan))
            print("\nCaching: " + caching.summary())
            for line in ["", *downloads] if downloads else []:
                print(line)
            print("\n".join(["", *memory_lines(cfg, arch, scan.buckets, steps=column.total_steps)]))
        return exitcodes.OK
    if args.command == "launch":
        return _launch(cfg, args)
    return _train(cfg)


def _memory_without_dataset(args) -> None:
    """`plan` when the dataset cannot be scanned: no step plan, but the memory plan at dataset.resolution."""
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError:
        return
    from .launch.memory_advice import memory_lines
    print(f"The step plan needs a dataset that can be scanned; the memory plan at dataset.resolution = "
          f"{cfg.dataset.resolution}:")
    print("\n".join(memory_lines(cfg, _plan_arch(cfg))))


def _plan_arch(cfg) -> str:
    """model.arch, or the family detected from model.path when it is "auto" (the plan needs no model:
    an undetectable path leaves "auto", and the memory plan says so)."""
    if cfg.model.arch != "auto" or not cfg.model.path or cfg.model.path.startswith("builtin:"):
        from .families.registry import BUILTIN_TINY
        builtin = BUILTIN_TINY.get(cfg.model.path.removeprefix("builtin:"), ("auto", ""))[0]
        return builtin if cfg.model.path.startswith("builtin:") and cfg.model.arch == "auto" else cfg.model.arch
    try:
        from .families import detect_family
        return detect_family(cfg.model.path).name
    except Exception:  # a missing or unknown model is the train command's error, not the plan's
        return "auto"


def _is_main_rank() -> bool:
    import os
    return os.environ.get("RANK", "0") == "0"


def _train(cfg) -> int:
    lock = None
    if _is_main_rank():  # before the slow imports, so a stop during them has a run folder to report in
        from .run.run_lock import acquire, note_stale
        lock = acquire(cfg.run_dir, by="train", argv=sys.argv)  # one trainer per run folder (exit 2 if held)
        note_stale(lock)
    try:
        return _train_locked(cfg)
    finally:
        if lock is not None:
            lock.release()


def _train_locked(cfg) -> int:
    from .model_sources import fetch_before_training  # hub ids: on every rank, before the process group
    fetch_before_training(cfg, main=_is_main_rank())
    from .training.optional_backends import hold_back_unused
    hold_back_unused(cfg)  # before diffusers/transformers import torchao/bitsandbytes for nothing
    from .training.loop import TrainingDiverged, train
    try:
        return train(cfg)
    except ConfigError:
        raise
    except TrainingDiverged as e:
        _record_error(cfg, str(e))
        return exitcodes.ERROR
    except Exception as e:  # one line on stderr and in the events; the traceback goes to train.log
        _traceback_to_log(cfg)
        _record_error(cfg, f"{type(e).__name__}: {e}")
        return exitcodes.ERROR


def _traceback_to_log(cfg) -> None:
    """The traceback of the exception being handled, appended to the run's train.log (stderr when
    the run folder is not the run's own)."""
    import time
    import traceback
    from .run.contract import LOG_FILE
    from .run.run_folder import has_marker
    text = traceback.format_exc()
    if _is_main_rank() and has_marker(cfg.run_dir):
        try:
            with open(cfg.run_dir / LOG_FILE, "a", encoding="utf-8") as log:
                log.write(f"{time.strftime('%H:%M:%S')} ERROR training failed\n{text}")
            return
        except OSError:
            pass
    if not _is_main_rank():
        return
    print(text, file=sys.stderr)


def _record_error(cfg, message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    _record_event(cfg, Event.ERROR, message=message)


def _record_event(cfg, kind: Event, **fields) -> None:
    """One event in the run's events.jsonl: main rank only, and only in a folder that is the run's own."""
    from .run.events import RunEvents
    from .run.run_folder import has_marker
    if not _is_main_rank() or not has_marker(cfg.run_dir):
        return
    try:
        events = RunEvents(cfg.run_dir, enabled=True, tensorboard=False)
        events.emit(kind, **fields)
        events.close()
    except OSError:
        pass


def _stopped_outside_the_loop(cfg, signum: int) -> int:
    """A stop signal before training began (or after it ended): nothing in progress to save."""
    from .run.checkpoint_files import list_checkpoints, step_of
    from .run.contract import CONTROL_DIR, Control
    kind, step = Event.PREEMPTED, 0
    if cfg is not None:
        kind = Event.STOPPED if (cfg.run_dir / CONTROL_DIR / Control.STOP.value).exists() else Event.PREEMPTED
        saved = list_checkpoints(cfg.run_dir)
        step = step_of(saved[-1]) if saved else 0
        _record_event(cfg, kind, step=step, epoch=None, outside_training=True)
    print(f"{kind} (signal {signum}) outside the training loop; nothing in progress was lost "
          f"(last checkpoint: step {step}). Start the same config again to continue.", file=sys.stderr)
    return exitcodes.STOPPED_SAVED


def _launch(cfg, args) -> int:
    from .run.run_lock import acquire, note_stale, unlocked
    if cfg.hardware.machine_rank != 0:  # the run's rank 0 (on machine 0) holds the lock
        return _launch_locked(cfg, args, unlocked(cfg.run_dir))
    with acquire(cfg.run_dir, by="launch", argv=sys.argv) as lock:  # held until the trainer ends
        note_stale(lock)
        return _launch_locked(cfg, args, lock)


def _launch_locked(cfg, args, lock) -> int:
    import subprocess
    import os
    from pathlib import Path
    from .config import save_toml, to_dict
    from .launch.argv import build_launch_argv, build_launch_env, write_strategy_files
    from .run.contract import COMMAND_FILE, CONFIG_FILE
    run_dir = lock.run_dir
    config_path = run_dir / CONFIG_FILE
    save_toml(to_dict(cfg), config_path)
    write_strategy_files(cfg, run_dir)
    argv = build_launch_argv(cfg, config_path)
    if args.dry_run:
        print(json.dumps(argv))
        return exitcodes.OK
    (Path(run_dir) / COMMAND_FILE).write_text(json.dumps(argv))
    from .run.stop_signals import launched_exit_code, event_line_count
    before = event_line_count(run_dir)
    code = subprocess.call(argv, env={**os.environ, **build_launch_env(cfg), **lock.child_env()},
                           pass_fds=lock.pass_fds())
    return launched_exit_code(code, run_dir, before)  # accelerate reports a rank's 75 as 1


if __name__ == "__main__":
    sys.exit(main())
