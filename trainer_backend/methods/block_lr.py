"""Which denoiser layers get adapters and how fast each block learns: network.exclude_modules (no
adapter on matching module paths) and network.block_lr (one optimizer parameter group per
learning-rate multiplier; 0 freezes the block's adapters). The family names the blocks
(`Family.block_of`); the keys are matched in config/block_patterns.py."""
from __future__ import annotations

import logging
import re

import torch

from ..config import ConfigError, TrainConfig
from ..config.block_patterns import matches, multiplier

LOG = logging.getLogger("trainer")
# peft's adapter parameter names: <module path>.<lora_A|hada_w1_a|lokr_w1|…>.<adapter>[.weight]
_ADAPTER_PART = re.compile(r"\.(lora_|hada_|lokr_)")


def exclude_pattern(cfg: TrainConfig) -> str | None:
    """network.exclude_modules as one regular expression for peft's `exclude_modules` (which it
    full-matches against each module path): any pattern found anywhere in the path."""
    patterns = cfg.network.exclude_modules
    return "|".join(f"(?:.*(?:{p}).*)" for p in patterns) if patterns else None


def check_excludes(cfg: TrainConfig, denoiser: torch.nn.Module) -> None:
    """A pattern that matches no module path is a typo: refused naming the key."""
    paths = [name for name, _ in denoiser.named_modules() if name]
    for pattern in cfg.network.exclude_modules:
        if not any(re.search(pattern, path) for path in paths):
            raise ConfigError(f"network.exclude_modules: {pattern!r} matches no module path of the "
                              f"{type(denoiser).__name__} (e.g. {paths[min(40, len(paths) - 1)]})")


def module_of(parameter_name: str) -> str:
    """The module path an adapter parameter belongs to ("down_blocks.0….to_q")."""
    return _ADAPTER_PART.split(parameter_name, maxsplit=1)[0]


def split_by_block(model, component: str, module: torch.nn.Module, group: dict, block_lr: dict[str, float]
                   ) -> list[dict]:
    """The component's parameter group split by block multiplier: lr = group lr × multiplier, the ×1
    group first (the loop reports the first group's LR); multiplier 0: requires_grad off, in no group.
    Keys that name no block that has adapters are refused naming network.block_lr."""
    family = model.family
    wanted = {id(p) for p in group["params"]}
    by_factor: dict[float, list] = {}
    blocks: dict[str, float] = {}
    for name, param in module.named_parameters():
        if id(param) not in wanted:
            continue
        block = family.block_of(model, module_of(name))
        factor = multiplier(block, block_lr)
        if block is not None:
            blocks[block] = factor
        if factor == 0:
            param.requires_grad_(False)  # stays at its start: zero effect, or network.network_weights
        else:
            by_factor.setdefault(factor, []).append(param)
    # a key for a block without adapters is harmless (kohya's lists name every block); one that names
    # no block of the model at all is a typo
    every = {family.block_of(model, path) for path, _ in module.named_modules()} - {None}
    for key in block_lr:
        if not any(matches(key, b) for b in every):
            raise ConfigError(f"network.block_lr: {key!r} names no block of this {type(module).__name__}; its "
                              f"blocks: {', '.join(sorted(every))}")
    _log(blocks)
    order = sorted(by_factor, key=lambda f: (f != 1.0, f))
    return [{"params": by_factor[f], "lr": group["lr"] * f, "name": f"{component} ×{f:g}"} for f in order]


def _log(blocks: dict[str, float]) -> None:
    changed: dict[float, list[str]] = {}
    for block, factor in sorted(blocks.items()):
        if factor != 1.0:
            changed.setdefault(factor, []).append(block)
    for factor, names in changed.items():
        what = "frozen" if factor == 0 else f"learning rate ×{factor:g}"
        LOG.info("network.block_lr: %s: %s", what, ", ".join(names))
