"""The adapters switched off for a moment, and the size of what they add: what the adapter-effect check
(diffusion/adapter_effect.py) needs to compare a sample with and without the trained adapter. Works for
every peft variant (LoRA, DoRA, LoHa, LoKr) on any module of any family: it only walks peft's tuner layers."""
from __future__ import annotations

import contextlib
import math

import torch


def _tuner_layers(modules):
    from peft.tuners.tuners_utils import BaseTunerLayer
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, BaseTunerLayer):
                yield sub


@contextlib.contextmanager
def adapters_disabled(modules):
    """The base model inside the block: every adapter layer of `modules` passes its input through the
    frozen weight alone. requires_grad flags are restored exactly afterwards (peft's enable_adapters(True)
    would make frozen blocks of network.block_lr trainable again)."""
    layers = list(_tuner_layers(modules))
    flags = [(p, p.requires_grad) for m in modules for p in m.parameters()]
    try:
        for layer in layers:
            layer.enable_adapters(False)
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p, flag in flags:
            p.requires_grad_(flag)


@torch.no_grad()
def adapter_delta_norm(modules) -> float:
    """sqrt(Σ ||ΔW||²) over every adapter layer: the Frobenius norm of what the adapters add to the base
    weights (LoRA's B starts at zero, so an untrained LoRA has norm 0). NaN if any delta is not finite."""
    total = 0.0
    for layer in _tuner_layers(modules):
        for name in layer.active_adapters:
            delta = layer.get_delta_weight(name)
            total += float(delta.float().pow(2).sum())
            if not math.isfinite(total):
                return float("nan")
    return math.sqrt(total)
