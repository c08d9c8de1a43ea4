"""optimizer.fused_backward: each trained weight steps as soon as its gradient is complete, inside the
backward pass (torch's post-accumulate-grad hook), and its gradient is freed at once, so a full
fine-tune never holds every gradient at the same time.

It is the run's one optimizer that steps, one weight at a time: its param_groups are narrowed to the
weight's own group holding that weight alone for the call, then restored. So the LR schedule (which
sets each group's lr before the backward), checkpoints (the optimizer's state_dict), resume and EMA
(after the backward) see the same optimizer as an ordinary step, and a per-weight optimizer (AdamW,
SGD, Lion, Adafactor, the 8-bit AdamW) gives the same weights as stepping them all together.
config/memory_rules.py refuses what cannot be exact: accumulation, clipping, several processes, fp16
loss scaling, and prodigy (whose step size depends on all gradients together).
"""
from __future__ import annotations

import torch


class FusedBackward:
    def __init__(self, optimizer: torch.optim.Optimizer, params):
        """optimizer: the torch optimizer itself (accelerate's wrapper's `.optimizer`)."""
        self.optimizer = optimizer
        # the group's index, not the group: loading a state dict (resume) replaces the group dicts
        self.group_of = {id(p): i for i, group in enumerate(optimizer.param_groups) for p in group["params"]}
        self.handles = [p.register_post_accumulate_grad_hook(self._step) for p in params
                        if p.requires_grad and id(p) in self.group_of]
        self.stepped = 0  # weights stepped so far (tests, logs)

    @torch.no_grad()
    def _step(self, param: torch.Tensor) -> None:
        groups = self.optimizer.param_groups
        group = groups[self.group_of[id(param)]]
        params = group["params"]
        group["params"] = [param]
        self.optimizer.param_groups = [group]
        try:
            self.optimizer.step()
        finally:
            self.optimizer.param_groups = groups
            group["params"] = params
        param.grad = None
        self.stepped += 1

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def inner_optimizer(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer behind accelerate's AcceleratedOptimizer (or the optimizer itself)."""
    return getattr(optimizer, "optimizer", optimizer)
