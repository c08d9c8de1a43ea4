"""The rules of the video options (config/rules.py runs them with the others; pure): frame buckets follow
the family's frame rule, and model.expert = both on several processes needs DDP to allow an expert
without gradients in a step (each sample trains the expert of its timestep)."""
from __future__ import annotations

from typing import Callable, Iterator

from ..families.registry import FAMILY_NAMES, entry
from .base import Problem
from .video_sections import TWO_EXPERT_FAMILIES
from .schema import TrainConfig

RULES: list[tuple[str, Callable[[TrainConfig], Iterator[Problem]]]] = []   # (group, rule)


def _rule(group: str):
    def register(fn):
        RULES.append((group, fn))
        return fn
    return register


@_rule("dataset")
def frame_buckets_follow_the_rule(cfg: TrainConfig) -> Iterator[Problem]:
    arch = cfg.model.arch
    step = entry(arch).frame_step if arch in FAMILY_NAMES else 0
    if not step:
        return
    wrong = [n for n in cfg.dataset.video_frame_buckets if n < 1 or (n - 1) % step]
    if wrong:
        yield Problem("dataset.video_frame_buckets", f"{', '.join(map(str, wrong))}: {entry(arch).label} takes "
                                                     f"{step}k+1 frames (1, {step + 1}, {2 * step + 1}, …)")


@_rule("hardware")
def both_experts_on_several_processes(cfg: TrainConfig) -> Iterator[Problem]:
    hw = cfg.hardware
    if cfg.model.expert != "both" or cfg.model.arch not in ("auto", *TWO_EXPERT_FAMILIES) or \
            hw.num_processes * hw.num_machines < 2:
        return
    if hw.strategy != "ddp":
        yield Problem("model.expert", f"\"both\" routes each sample to one expert, which {hw.strategy} cannot "
                                      "follow; use hardware.strategy = \"ddp\", or train \"high\" and \"low\" apart")
    elif not hw.ddp_find_unused_parameters:
        yield Problem("hardware.ddp_find_unused_parameters", "must be true with model.expert = \"both\" on several "
                                                             "processes: a step may give one expert no sample")
