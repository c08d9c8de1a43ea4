"""Captioners: a dataset's captions written by a vision-language model (Florence-2, Qwen2.5-VL,
Qwen3-VL, JoyCaption) or a WD14-style tagger, run as a job in its own process, every write an
undoable entry of the dataset's workbench journal. docs/dataset.md, "Captioning".

    python -m trainer_backend caption --dataset FOLDER --model ID_OR_PATH [options]
    start_caption_job(CaptionOptions(...)) / caption_progress(job_dir) / stop_caption_job(job_dir)
    queue_caption_job(job_queue, CaptionOptions(...))   (a job of the studio's queue)

This face imports no torch (the studio imports it); the models load in the job's process."""
from __future__ import annotations

from .kinds import KIND_NAMES, KINDS, TINY_ARCHS, CaptionerKind, detect_kind
from .options import CaptionOptions
from .process import (CaptionProgress, caption_argv, caption_progress, queue_caption_job, start_caption_job,
                      stop_caption_job)

__all__ = ["KINDS", "KIND_NAMES", "TINY_ARCHS", "CaptionOptions", "CaptionProgress", "CaptionerKind",
           "build_tiny_captioner", "caption_argv", "caption_progress", "detect_kind", "queue_caption_job", "run_caption_job",
           "start_caption_job", "stop_caption_job"]


def build_tiny_captioner(kind: str, out, seed: int = 0):
    from .tiny import build_tiny_captioner as build
    return build(kind, out, seed)


def run_caption_job(options: CaptionOptions, own_process: bool = False) -> int:
    from .job import run_caption_job as run
    return run(options, own_process)
