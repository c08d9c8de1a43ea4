"""Which checkpoints to keep: pure arithmetic shared by local and remote pruning.

Policy: the newest `keep_last`; every step that is a multiple of `keep_every` (kept forever);
the `keep_best` ones with the lowest value of `metric`. Checkpoints without the metric never
count as best.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int
    keep_every: int = 0
    keep_best: int = 0
    metric: str = "loss"

    @classmethod
    def from_config(cls, ck, keep_last: int = 0) -> "RetentionPolicy":
        """From a [checkpoints] section; keep_last overrides its keep_last (remote retention)."""
        return cls(keep_last=keep_last or ck.keep_last, keep_every=ck.keep_every_n_steps,
                   keep_best=ck.keep_best, metric=ck.best_metric)


def retained_steps(checkpoints: list[tuple[int, dict]], policy: RetentionPolicy) -> set[int]:
    """The steps to keep among (step, metrics) pairs."""
    steps = sorted({step for step, _ in checkpoints})
    keep = set(steps[-policy.keep_last:]) if policy.keep_last > 0 else set()
    if policy.keep_every > 0:
        keep |= {s for s in steps if s > 0 and s % policy.keep_every == 0}
    if policy.keep_best > 0:
        scored = []
        for step, metrics in checkpoints:
            value = (metrics or {}).get(policy.metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                scored.append((value, step))
        keep |= {step for _, step in sorted(scored)[:policy.keep_best]}
    return keep
