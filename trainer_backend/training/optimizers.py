"""Optimizer and learning-rate schedule from the config."""
from __future__ import annotations

import torch

from ..config import ConfigError, TrainConfig, rules
from .full_half_precision import ROUNDED_OPTIMIZERS, half_weights_dtype


def build_optimizer(cfg: TrainConfig, param_groups: list[dict], lr_factor: float = 1.0) -> torch.optim.Optimizer:
    """lr_factor: the plan's multi-GPU LR scaling (Plan.lr_factor), applied to every group."""
    o = cfg.optimizer
    groups = [{"params": g["params"], "lr": g["lr"] * lr_factor} for g in param_groups]
    rules.check(cfg, "optimizer_package")  # its package is installed (config/rules.py)
    if half_weights_dtype(cfg) and o.name in ROUNDED_OPTIMIZERS and not o.fused:  # precision.full_bf16/full_fp16
        from .half_precision_optimizers import HalfWeightsAdamW, HalfWeightsSGD
        rounding, seed = cfg.precision.half_weights_rounding, cfg.schedule.seed
        if o.name == "adamw":
            return HalfWeightsAdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                    weight_decay=o.weight_decay, rounding=rounding, seed=seed)
        return HalfWeightsSGD(groups, lr=o.lr, momentum=o.beta1, weight_decay=o.weight_decay, rounding=rounding,
                              seed=seed)
    # None: torch's default (foreach on a GPU). With precision.full_bf16 (and nearest rounding, config/memory_rules.py)
    # the fused AdamW steps the bf16 weights itself: fp32 arithmetic, weights and moments rounded to nearest.
    fused = o.fused or None
    if o.name == "adamw":
        return _keeping_implementation(torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                                         weight_decay=o.weight_decay, fused=fused))
    if o.name == "sgd":
        return _keeping_implementation(torch.optim.SGD(groups, lr=o.lr, momentum=o.beta1,
                                                       weight_decay=o.weight_decay, fused=fused))
    if o.name == "adafactor":
        from transformers.optimization import Adafactor
        return Adafactor(groups, lr=o.lr, relative_step=False, scale_parameter=False, warmup_init=False,
                         weight_decay=o.weight_decay)
    if o.name in ("adamw8bit", "paged_adamw8bit"):  # 8-bit states; paged: CUDA unified memory, spills to RAM
        import bitsandbytes as bnb
        cls = bnb.optim.PagedAdamW8bit if o.name == "paged_adamw8bit" else bnb.optim.AdamW8bit
        return cls(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                   weight_decay=o.weight_decay)
    if o.name == "prodigy":
        from prodigyopt import Prodigy
        return Prodigy(groups, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
    if o.name == "lion":
        from lion_pytorch import Lion
        return Lion(groups, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
    raise ConfigError(f"optimizer.name: unsupported '{o.name}'")


IMPLEMENTATION_FLAGS = ("fused", "foreach")


def _keeping_implementation(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """torch's load_state_dict takes the param groups' flags from the checkpoint, so a resume would silently keep
    the implementation the checkpoint was saved with: the config's optimizer.fused wins instead."""
    own = [{k: g.get(k) for k in IMPLEMENTATION_FLAGS} for g in optimizer.param_groups]

    def keep(opt: torch.optim.Optimizer, state_dict: dict) -> dict:
        # new dicts: torch hands the hook a shallow copy, whose groups and entries are the caller's
        state_dict["param_groups"] = [{**group, **flags} for group, flags in zip(state_dict["param_groups"], own)]
        if own and own[0]["fused"]:  # precision.full_bf16's own AdamW counts steps in ints, the fused kernel in tensors
            state_dict["state"] = {key: {**entries, "step": torch.tensor(float(entries["step"]))}
                                   if isinstance(entries.get("step"), int) else entries
                                   for key, entries in state_dict["state"].items()}
        return state_dict

    optimizer.register_load_state_dict_pre_hook(keep)
    return optimizer


def build_lr_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int,
                       warmup_steps: int | None = None):
    """One scheduler step per optimizer step (never prepared by accelerate, which would step it
    once per process), so warmup and decay land on the plan's optimizer steps."""
    from diffusers.optimization import get_scheduler
    o = cfg.optimizer
    kwargs = {}
    if o.scheduler == "cosine_with_restarts":
        kwargs["num_cycles"] = o.lr_cycles
    warmup = o.warmup_steps if warmup_steps is None else warmup_steps  # the plan's, on N processes
    return get_scheduler(o.scheduler, optimizer, num_warmup_steps=warmup,
                         num_training_steps=max(total_steps, 1), **kwargs)
