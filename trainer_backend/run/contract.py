"""The run-directory contract: the file names and the event kinds the trainer writes and the
studio reads. Both sides import them from here (pure: no torch), so neither can drift.

<output.dir>/<output.name>/
    config.toml     the complete resolved config (never secrets)
    command.txt     the exact argv
    events.jsonl    one JSON object per line, {"event": <Event>, "time": …, …}; main process only
    train.log       the full human log
    tb/             TensorBoard events
    control/        stop, save_now, sample_now: files the studio touches, the trainer takes
    checkpoints/    step-XXXXXXXX/ with manifest.json written last
    samples/        sample images
    process.json, exit.json, console.log   written by the studio about the process it started
    .sd-studio-run  marks the folder as a run's (written when the run created it; Delete needs it)
"""
from __future__ import annotations

from enum import Enum

CONFIG_FILE = "config.toml"
COMMAND_FILE = "command.txt"
EVENTS_FILE = "events.jsonl"
LOG_FILE = "train.log"
TENSORBOARD_DIR = "tb"
CONTROL_DIR = "control"
CHECKPOINTS_DIR = "checkpoints"
SAMPLES_DIR = "samples"
PROCESS_FILE = "process.json"
EXIT_FILE = "exit.json"
CONSOLE_LOG = "console.log"
RUN_MARKER = ".sd-studio-run"   # written when a run creates its folder (run/run_folder.py)
RUN_KIND = "sd-training-studio run"


class Control(str, Enum):
    """Files under control/ that ask the running trainer for something."""
    STOP = "stop"              # finish the step, save a checkpoint, exit 75 ("stopped")
    SAVE_NOW = "save_now"      # save a checkpoint after the current step
    SAMPLE_NOW = "sample_now"  # sample images after the current step


class Event(str, Enum):
    """Every kind of line in events.jsonl, with what it carries besides "time"."""
    PLAN = "plan"                  # the step plan (launch/plan.py Plan.to_dict)
    START = "start"                # step, total_steps: training begins (fresh or resumed)
    RESUMED = "resumed"            # step, path, changed: continued from a checkpoint
    CLASS_IMAGES = "class_images"  # folder, wanted, user, generated: DreamBooth class images ready
    STEP = "step"                  # step, total_steps, epoch, samples, loss, lr, it_per_s, eta_s, (loss parts)
    EPOCH = "epoch"                # epoch, step
    SAMPLE = "sample"              # step, epoch, paths, prompts, ema
    VALIDATION = "validation"      # step, loss, …: held-out loss
    CHECKPOINT = "checkpoint"      # step, path, reason
    EXPORT = "export"              # step, path: an intermediate output file
    UPLOAD = "upload"              # status, what, step, url, …: the cloud uploader
    DONE = "done"                  # step, outputs, elapsed_s
    STOPPED = "stopped"            # step, epoch: stopped on request, state saved
    PREEMPTED = "preempted"        # step, epoch: stopped by a signal (spot instance), state saved
    ERROR = "error"                # message

    def __str__(self) -> str:  # f-strings and json see the plain kind
        return self.value


EVENT_KINDS: frozenset[str] = frozenset(e.value for e in Event)
TERMINAL: tuple[str, ...] = (Event.DONE.value, Event.STOPPED.value, Event.PREEMPTED.value, Event.ERROR.value)
