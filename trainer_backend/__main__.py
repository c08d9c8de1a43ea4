"""CLI: python -m trainer_backend train|launch|validate|plan|inspect|make-tiny-model.

Exit codes: 0 ok, 1 error, 2 bad config or input (one line on stderr naming the key or
file), 75 stopped with state saved (see exitcodes.py).
"""
from __future__ import annotations

import argparse
import json
import sys

from .run import exitcodes
from .config import ConfigError, load_config
from .families.registry import FAMILY_NAMES


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
    ref = sub.add_parser("config-reference", help="print (or --write into README.md) the config reference")
    ref.add_argument("--write", metavar="README", default=None)
    tiny = sub.add_parser("make-tiny-model", help="build a tiny random model (diffusers folder) for tests/demo")
    tiny.add_argument("--arch", choices=list(FAMILY_NAMES), required=True)
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--seed", type=int, default=0)
    return parser


def _load(args):
    from .config.checks import validate_dataset_only, validate_for_run
    cfg = load_config(args.config, args.overrides)
    if args.command in ("plan", "inspect"):  # need only the dataset (the GUI inspects before a model is set)
        return validate_dataset_only(cfg)
    return validate_for_run(cfg)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return exitcodes.BAD_CONFIG


def _dispatch(args) -> int:
    if args.command == "make-tiny-model":
        from .families import build_tiny_model
        print(build_tiny_model(args.arch, args.out, seed=args.seed))
        return exitcodes.OK
    if args.command == "config-reference":
        from .config.reference import config_reference, write_into
        if args.write:
            from pathlib import Path
            write_into(Path(args.write))
        else:
            print(config_reference())
        return exitcodes.OK
    if args.command == "validate":  # every cross-field problem at once, one line each
        from .config import rules
        found = rules.problems(load_config(args.config, args.overrides))
        if found:
            for message in found:
                print(f"error: {message}", file=sys.stderr)
            return exitcodes.BAD_CONFIG
    cfg = _load(args)
    if args.command == "validate":
        print(f"ok: {args.config or 'defaults'} is valid")
        return exitcodes.OK
    if args.command in ("plan", "inspect"):
        from .data import scan_dataset
        scan = scan_dataset(cfg)
        if args.command == "inspect":
            from dataclasses import asdict
            print(json.dumps({"summary": scan.summary, "counts": asdict(scan.counts)}, default=str))
            return exitcodes.OK
        from .launch.plan import format_plan_table, plan_from_config
        plan = plan_from_config(cfg, scan.counts, args.num_processes)
        print(json.dumps(plan.to_dict(), indent=1) if args.json else format_plan_table(plan))
        return exitcodes.OK
    if args.command == "launch":
        return _launch(cfg, args)
    return _train(cfg)


def _train(cfg) -> int:
    import logging
    from .training.loop import TrainingDiverged, train
    try:
        return train(cfg)
    except ConfigError:
        raise
    except TrainingDiverged as e:
        _record_error(cfg, str(e))
        return exitcodes.ERROR
    except Exception as e:  # the event stream must say why the run ended
        logging.getLogger("trainer").exception("training failed")
        _record_error(cfg, f"{type(e).__name__}: {e}")
        return exitcodes.ERROR


def _record_error(cfg, message: str) -> None:
    import os
    from .run.events import RunEvents
    print(f"error: {message}", file=sys.stderr)
    if os.environ.get("RANK", "0") == "0":
        events = RunEvents(cfg.run_dir, enabled=True, tensorboard=False)
        events.emit("error", message=message)
        events.close()


def _launch(cfg, args) -> int:
    import subprocess
    import os
    from pathlib import Path
    from .config import save_toml, to_dict
    from .launch.argv import build_launch_argv, build_launch_env, write_strategy_files
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.toml"
    save_toml(to_dict(cfg), config_path)
    write_strategy_files(cfg, run_dir)
    argv = build_launch_argv(cfg, config_path)
    if args.dry_run:
        print(json.dumps(argv))
        return exitcodes.OK
    (Path(run_dir) / "command.txt").write_text(json.dumps(argv))
    from .run.stop_signals import launched_exit_code, event_line_count
    before = event_line_count(run_dir)
    code = subprocess.call(argv, env={**os.environ, **build_launch_env(cfg)})
    return launched_exit_code(code, run_dir, before)  # accelerate reports a rank's 75 as 1


if __name__ == "__main__":
    sys.exit(main())
