"""The frozen modules that only sample (Family.sampling_only: Wan 2.2's expert that does not train) under the
run's memory options.

They are frozen base, stored as the trained denoiser's base is: in its compute dtype and, with model.quantize,
quantized the same way (torchao int8/float8, nf4, or the 8-bit compute layers), in host memory between sample
rounds. For a round (`SamplingResidency.placed`, the model's `sampling_placement`) they come to the accelerator:
- whole, when the run streams nothing (no memory.block_swap, no memory.offload_encoders);
- else block by block: a BlockSwap over all their blocks (each block fetched for its own forward, the next one
  prefetched on a side stream, its frozen weights dropped after use: the host copy is exact), and only their
  small non-block parts (embeddings, the output head) moved in for the round. The trained denoiser keeps its
  own swap, so nothing is ever moved whole to a card that has no room for it.
Afterwards everything is back in host memory.
"""
from __future__ import annotations

import contextlib
import logging

import torch

from ..compute.weight_storage import copy_quant_state, copy_storage, install, quant_state_of, storage_of
from ..config import TrainConfig
from . import block_swap

LOG = logging.getLogger("trainer")
HOST = torch.device("cpu")


def tensors_of(module: torch.nn.Module, skip: list[torch.nn.Module] = ()) -> list[torch.Tensor]:
    """module's weights and buffers, each once, but those of the `skip` submodules."""
    skipped = {id(t) for m in skip for t in (*m.parameters(), *m.buffers())}
    return list({id(t): t for t in (*module.parameters(), *module.buffers()) if id(t) not in skipped}.values())


def move(tensors: list[torch.Tensor], device: torch.device) -> None:
    """Each tensor's storage on `device`, quantized ones whole (torchao's inner tensors, nf4's quant_state);
    each keeps its Parameter object."""
    for t in tensors:
        install(t, copy_storage(storage_of(t), lambda x: x.to(device)))
        state = quant_state_of(t)
        if state is not None:
            t.quant_state = copy_quant_state(state, lambda x: x.to(device))


class SamplingResidency:
    """Where the sampling-only modules are during a sample round (see the module docstring)."""

    def __init__(self, parts: list[tuple[torch.nn.Module, list[torch.nn.Module]]], device, streamed: bool):
        self.parts, self.device, self.streamed = parts, torch.device(device), streamed
        self.swaps: list[block_swap.BlockSwap] = []   # made at the first round (after the trained denoiser's)

    def moved_whole(self) -> list[torch.Tensor]:
        """What a round moves in and out itself: the non-block parts (streamed), else everything."""
        return [t for module, blocks in self.parts for t in tensors_of(module, blocks if self.streamed else ())]

    @contextlib.contextmanager
    def placed(self):
        if self.streamed and not self.swaps:
            self.swaps = [block_swap.BlockSwap(blocks, len(blocks), self.device) for _, blocks in self.parts]
        tensors = self.moved_whole()
        move(tensors, self.device)
        try:
            yield
        finally:
            move(tensors, HOST)
            for swap in self.swaps:  # a round that failed half-way may have left a block on the device
                swap.settle()


def place_sampling_only(cfg: TrainConfig, model, device, dtype: torch.dtype) -> SamplingResidency | None:
    """Store the family's sampling-only modules as the frozen base in host memory and give the model the
    placement its sample rounds use (model.sampling_placement). None when the family has none."""
    from ..compute.lowbit_linear import COMPUTE_KINDS, to_lowbit_compute
    from ..compute.quantize import quantize_module
    family = model.family
    parts = family.sampling_only(model) if family is not None and model.denoiser is not None else []
    if not parts:
        return None
    kind, keep = cfg.model.quantize, getattr(family, "keep_unquantized", ())
    for module, blocks in parts:
        module.requires_grad_(False)
        if kind in COMPUTE_KINDS:
            to_lowbit_compute(module.to(dtype=dtype), kind, keep=keep)
        elif kind != "none":  # each block quantized on the device in its turn and sent home (compute/quantize.py)
            quantize_module(module, kind, device=device, compute_dtype=dtype, keep=keep, host=blocks)
            move(tensors_of(module, blocks), HOST)
        else:
            module.to(HOST, dtype=dtype)
    streamed = bool(cfg.memory.block_swap or cfg.memory.offload_encoders)
    residency = SamplingResidency(parts, device, streamed)
    model.sampling_placement = residency.placed
    LOG.info("%d frozen module(s) only sample (%s); they wait in CPU memory and come to %s %s", len(parts),
             ", ".join(type(m).__name__ for m, _ in parts), device,
             "one block at a time for samples (memory.block_swap / offload_encoders)" if streamed
             else "whole for samples")
    return residency
