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
    tensorboard.log the studio's TensorBoard server's output
    .sd-studio-run  marks the folder as a run's (written when the run created it; Delete needs it)
    .sd-studio-lock held (flock) by the one trainer writing the folder; says who (run/run_lock.py)
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
CHECKPOINT_PREFIX = "step-"       # checkpoints/step-00000100/
MANIFEST_FILE = "manifest.json"   # written last into a checkpoint folder: without it, incomplete
SAMPLES_DIR = "samples"
PROCESS_FILE = "process.json"
EXIT_FILE = "exit.json"
CONSOLE_LOG = "console.log"
TENSORBOARD_LOG = "tensorboard.log"   # the studio's TensorBoard server (gui/run_tools.py)
RUN_MARKER = ".sd-studio-run"   # written when a run creates its folder (run/run_folder.py)
RUN_KIND = "sd-training-studio run"
LOCK_FILE = ".sd-studio-lock"   # one trainer per run folder (run/run_lock.py)


class Control(str, Enum):
    """Files under control/ that ask the running trainer for something."""
    STOP = "stop"              # finish the step, save a checkpoint, exit 75 ("stopped")
    SAVE_NOW = "save_now"      # save a checkpoint after the current step
    SAMPLE_NOW = "sample_now"  # sample images after the current step

    def __str__(self) -> str:
        return self.value


class Event(str, Enum):
    """Every kind of line in events.jsonl; FIELDS says what each carries besides "event" and "time"."""
    PLAN = "plan"                  # the step plan (launch/plan.py Plan.to_dict)
    START = "start"                # training begins (fresh or resumed)
    RESUMED = "resumed"            # continued from a checkpoint
    CLASS_IMAGES = "class_images"  # DreamBooth class images ready
    STEP = "step"                  # one optimizer step (plus the loss parts of the method, e.g. prior loss)
    EPOCH = "epoch"                # an epoch ended
    SAMPLE = "sample"              # sample images written
    VALIDATION = "validation"      # held-out loss
    CHECKPOINT = "checkpoint"      # a complete checkpoint folder
    EXPORT = "export"              # an intermediate output file
    UPLOAD = "upload"              # the cloud uploader's progress (status: started, done, failed, …)
    DOWNLOAD = "download"          # a hub model's download (model_sources/progress.py DownloadStatus)
    DONE = "done"                  # finished: the outputs
    STOPPED = "stopped"            # stopped on request, state saved
    PREEMPTED = "preempted"        # stopped by a signal (spot instance), state saved
    ERROR = "error"                # failed: the one-line message
    WARNING = "warning"            # the run goes on, but something is likely wrong (cause, message)
    ADAPTER_EFFECT = "adapter_effect"  # the end's measure: the same sample with vs without the adapter
    COMPILE = "compile"            # speed.compile: the compile phase (started, done) and later recompilations

    def __str__(self) -> str:  # f-strings and json see the plain kind
        return self.value


OPEN = None  # an event whose fields are another module's dict (the plan)
FIELDS: dict[Event, tuple[str, ...] | None] = {
    Event.PLAN: OPEN,
    Event.START: ("step", "total_steps", "epoch", "run_id", "resumed_from", "remote"),
    Event.RESUMED: ("step", "path", "changed"),
    Event.CLASS_IMAGES: ("folder", "wanted", "user", "reused", "generated"),
    Event.STEP: ("step", "total_steps", "epoch", "samples", "loss", "lr", "it_per_s", "eta_s"),
    Event.EPOCH: ("epoch", "step"),
    Event.SAMPLE: ("step", "epoch", "paths", "prompts", "ema", "adapter_effect", "adapter_norm",
                   "strength", "source", "rows", "adapter"),   # the last four: `lora sample` (lora_tools/strengths.py)
    Event.VALIDATION: ("step", "epoch", "loss", "best", "images", "timesteps"),
    Event.COMPILE: ("step", "status", "blocks", "graphs", "seconds"),
    Event.CHECKPOINT: ("step", "path", "trigger", "metrics", "export", "remote"),
    Event.EXPORT: ("step", "path"),
    Event.UPLOAD: ("status", "what", "step", "url", "bytes", "queued", "seconds", "attempts", "retry_in_s",
                   "error", "message", "pending"),
    Event.DOWNLOAD: ("repo", "status", "file", "bytes", "total", "file_bytes", "file_total", "files_done",
                     "files_total", "speed", "eta_s", "free_bytes", "cached_bytes"),
    Event.DONE: ("step", "outputs", "elapsed_s"),
    Event.STOPPED: ("step", "epoch", "outside_training", "message"),   # message: a LoRA-tool job's stop
    Event.PREEMPTED: ("step", "epoch", "outside_training"),
    Event.ERROR: ("message",),
    Event.WARNING: ("step", "cause", "message", "adapter_effect", "adapter_norm"),
    Event.ADAPTER_EFFECT: ("step", "adapter_effect", "adapter_norm", "flat"),
}

EVENT_KINDS: frozenset[str] = frozenset(e.value for e in Event)
TERMINAL: tuple[Event, ...] = (Event.DONE, Event.STOPPED, Event.PREEMPTED, Event.ERROR)
NOTIFIED: tuple[Event, ...] = (Event.START, Event.CHECKPOINT, Event.SAMPLE, Event.EPOCH, Event.WARNING,
                                *TERMINAL)  # webhooks
SAVED_STOPS: tuple[Event, ...] = (Event.STOPPED, Event.PREEMPTED)  # ended with state saved: resumable
