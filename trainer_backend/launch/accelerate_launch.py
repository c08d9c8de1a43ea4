"""`accelerate launch`, run as accelerate runs it, with one difference: when the trainer exits non-zero
the launch exits with the trainer's code and adds nothing. accelerate's own entry raises
CalledProcessError (torchrun: ChildFailedError) there, and its traceback buried the trainer's one-line
reason ("error: model.path: … not a safetensors file") under twenty lines of launcher internals, with
exit code 1 for every failure (issue 29 item 3).

    python -m trainer_backend.launch.accelerate_launch <accelerate launch's flags> -m trainer_backend train …
"""
from __future__ import annotations

import subprocess
import sys


def failed_child_code(error: BaseException) -> int | None:
    """The exit code of the trainer a launcher exception reports, or None when it is not a child's exit
    (a launcher bug: its traceback is wanted)."""
    if isinstance(error, subprocess.CalledProcessError):
        return error.returncode or 1
    failures = getattr(error, "failures", None)   # torch.distributed.elastic's ChildFailedError
    if type(error).__name__ == "ChildFailedError" and isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        return int(getattr(first, "exitcode", 1) or 1)
    return None


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except Exception as e:  # noqa: BLE001 (only a child's exit is turned into a code; the rest re-raised)
        code = failed_child_code(e)
        if code is None:
            raise
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
