"""What the memory options do to a loaded model (docs/memory.md): which blocks memory.block_swap keeps
on the host, which modules memory.offload_encoders offloads, and the hooks of both and of
optimizer.fused_backward, installed where the loop needs them (setup.place_encoders and place_denoiser, after prepare)."""
from __future__ import annotations

import logging

import torch

from ..config import ConfigError, TrainConfig
from .block_swap import BlockSwap, offload_frozen
from .fused_backward import FusedBackward, inner_optimizer

LOG = logging.getLogger("trainer")


def swapped_blocks(cfg: TrainConfig, model) -> list[torch.nn.Module]:
    """The denoiser blocks memory.block_swap keeps in CPU memory (the last N of the family's blocks)."""
    count = cfg.memory.block_swap
    if not count or model.denoiser is None:
        return []
    blocks = model.family.blocks(model)
    if count > len(blocks):
        raise ConfigError(f"memory.block_swap: {model.family.label}'s denoiser has {len(blocks)} blocks, "
                          f"so at most {len(blocks)} can be swapped; got {count}")
    return blocks[len(blocks) - count:]


def offloaded_modules(cfg: TrainConfig, model, trained_encoders: set[int]) -> list[torch.nn.Module]:
    """memory.offload_encoders: the VAE and the frozen text encoders (trained ones stay on the device)."""
    if not cfg.memory.offload_encoders or model.denoiser is None:
        return []
    return [model.vae, *(te for te in model.text_encoders if id(te) not in trained_encoders)]


def offload_encoders(modules: list[torch.nn.Module], device) -> list[BlockSwap]:
    swaps = offload_frozen(modules, device)
    if swaps:
        LOG.info("memory.offload_encoders: %d module(s) live in CPU memory between uses", len(swaps))
    return swaps


def install_after_prepare(cfg: TrainConfig, model, trainable, optimizer, device) -> dict:
    """Block swap on the denoiser and the fused backward's hooks, once accelerate prepared the modules.
    Returns what was installed ({"block_swap": BlockSwap, "fused": FusedBackward}), for tests and logs."""
    installed = {}
    blocks = swapped_blocks(cfg, model)
    if blocks:
        every = model.family.blocks(model)
        opt = inner_optimizer(optimizer) if cfg.optimizer.fused_backward else None
        installed["block_swap"] = BlockSwap(every, len(blocks), device, optimizer=opt)
        LOG.info("memory.block_swap: %d of %d denoiser blocks live in CPU memory, streamed to %s ahead of use",
                 len(blocks), len(every), device)
    if cfg.optimizer.fused_backward:
        installed["fused"] = FusedBackward(inner_optimizer(optimizer), trainable.parameters())
        LOG.info("optimizer.fused_backward: %d weights step during the backward pass", len(installed["fused"].handles))
    return installed
