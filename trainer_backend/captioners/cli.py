"""`python -m trainer_backend caption --dataset FOLDER --model ID_OR_PATH [options]` (the flags come
from options.CaptionOptions). Exit codes as training's: 0 done, 1 failed, 2 bad input (one line
naming the flag), 75 stopped (a second start continues)."""
from __future__ import annotations

import argparse
import sys

from .options import add_arguments, from_namespace


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser("caption", help="caption a dataset's images with a captioner (its own job folder)",
                            description=__doc__.splitlines()[0])
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the job in this process (the studio starts it as a subprocess: process.py)."""
    from ..run.stop_signals import StartupStop, stop_outside_the_loop
    from ..run import exitcodes
    with stop_outside_the_loop():   # a Stop during the imports: exit 75 like a stopped job
        try:
            from .job import run_caption_job
        except StartupStop:
            return exitcodes.STOPPED_SAVED
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    own = getattr(main, "name", "") == "trainer_backend.__main__"   # `python -m trainer_backend`, not a test's main()
    return run_caption_job(from_namespace(args), own_process=own)
