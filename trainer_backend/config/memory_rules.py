"""The rules of the memory options (config/rules.py runs them with the others): what
optimizer.fused_backward, optimizer.fused and memory.block_swap cannot be combined with, each refusal naming the
keys to change. Pure: no torch, nothing above config/."""
from __future__ import annotations

from typing import Callable, Iterator

from .base import Problem
from .caching import static_shape_blockers
from .schema import TrainConfig
from .train_sections import FUSED_OPTIMIZERS

RULES: list[tuple[str, Callable[[TrainConfig], Iterator[Problem]]]] = []   # (group, rule)
# optimizers whose update of one weight depends on every other weight's gradient in the same step
WHOLE_STEP_OPTIMIZERS = {"prodigy": "prodigy's step size is estimated from all gradients of the step together"}


def _rule(group: str):
    def register(fn):
        RULES.append((group, fn))
        return fn
    return register


def processes(cfg: TrainConfig) -> int:
    return cfg.hardware.num_processes * cfg.hardware.num_machines


def sharded(cfg: TrainConfig) -> bool:
    """DeepSpeed or FSDP own the weights, gradients and optimizer (even in one process)."""
    return cfg.hardware.strategy != "ddp"


@_rule("memory")
def _fused_backward(cfg: TrainConfig) -> Iterator[Problem]:
    if not cfg.optimizer.fused_backward:
        return
    key = "optimizer.fused_backward"
    if cfg.schedule.grad_accum > 1:
        yield Problem(key, f"steps each weight as soon as its gradient is ready, so gradients cannot be "
                           f"accumulated over batches: set schedule.grad_accum = 1 (got {cfg.schedule.grad_accum}) "
                           f"or turn fused_backward off")
    if cfg.optimizer.max_grad_norm > 0:
        yield Problem(key, f"gradient clipping needs the norm of all gradients together, known only after the "
                           f"whole backward pass: set optimizer.max_grad_norm = 0 (got {cfg.optimizer.max_grad_norm}) "
                           f"or turn fused_backward off")
    if sharded(cfg):
        yield Problem(key, f"hardware.strategy = {cfg.hardware.strategy} steps the weights itself: use "
                           f"hardware.strategy = ddp or turn fused_backward off")
    if processes(cfg) > 1:
        yield Problem(key, "each process would step on its own gradients before they are averaged across "
                           "processes: use one process (hardware.num_processes = 1, hardware.num_machines = 1) "
                           "or turn fused_backward off")
    if cfg.precision.mixed == "fp16":
        yield Problem(key, "fp16 loss scaling checks every gradient for overflow before any weight steps: use "
                           "precision.mixed = bf16 or no, or turn fused_backward off")
    if cfg.optimizer.name in WHOLE_STEP_OPTIMIZERS:
        yield Problem(key, f"{WHOLE_STEP_OPTIMIZERS[cfg.optimizer.name]}: choose another optimizer.name or turn "
                           f"fused_backward off")


@_rule("memory")
def _fused_optimizer(cfg: TrainConfig) -> Iterator[Problem]:
    if not cfg.optimizer.fused:
        return
    if cfg.optimizer.name not in FUSED_OPTIMIZERS:
        yield Problem("optimizer.fused", f"PyTorch has a fused kernel for {' and '.join(FUSED_OPTIMIZERS)} only, not "
                                         f"'{cfg.optimizer.name}': choose one of them or turn fused off")
    if cfg.precision.full_fp16:
        yield Problem("optimizer.fused", "precision.full_fp16 keeps the optimizer's moments in bf16 (fp16 would "
                                         "underflow them), which PyTorch's fused kernel cannot: turn one of them off")
    elif cfg.precision.full_bf16 and cfg.optimizer.name != "adamw":
        yield Problem("optimizer.fused", f"with precision.full_bf16 only adamw has a fused kernel here, not "
                                         f"'{cfg.optimizer.name}': choose adamw or turn fused off")
    elif cfg.precision.full_bf16 and cfg.precision.half_weights_rounding != "nearest":
        yield Problem("optimizer.fused", f"with precision.full_bf16, PyTorch's fused AdamW rounds each update to the "
                                         f"nearest bf16 value: set precision.half_weights_rounding = \"nearest\" "
                                         f"(got \"{cfg.precision.half_weights_rounding}\") or turn fused off")


@_rule("memory")
def _block_swap(cfg: TrainConfig) -> Iterator[Problem]:
    if cfg.memory.block_swap and cfg.network.type != "vae" and (processes(cfg) > 1 or sharded(cfg)):
        yield Problem("memory.block_swap", "swapped blocks move between CPU and GPU memory under DDP/FSDP/"
                                           "DeepSpeed's gradient buffers: use one process (hardware.num_processes "
                                           "= 1, hardware.num_machines = 1, hardware.strategy = ddp) or set "
                                           "memory.block_swap = 0")


@_rule("memory")
def _compiled_blocks(cfg: TrainConfig) -> Iterator[Problem]:
    if cfg.speed.compile == "off":
        return
    key = "speed.compile"
    if cfg.memory.block_swap:
        yield Problem(key, f"memory.block_swap moves {cfg.memory.block_swap} blocks' weights between the CPU and "
                           f"the GPU every step, which a compiled block would recompile for: set "
                           f"memory.block_swap = 0 or speed.compile = off")
    if sharded(cfg):
        yield Problem(key, f"hardware.strategy = {cfg.hardware.strategy} wraps and shards the blocks itself: use "
                           f"hardware.strategy = ddp or speed.compile = off")
    if cfg.speed.compile_mode == "reduce-overhead" and cfg.hardware.cpu:
        yield Problem("speed.compile_mode", "reduce-overhead records CUDA graphs, which need a CUDA device: "
                                            "choose default or max-autotune-no-cudagraphs on the CPU")
    elif cfg.speed.compile_mode == "reduce-overhead" and (blockers := static_shape_blockers(cfg)):
        yield Problem("speed.compile_mode", f"reduce-overhead records CUDA graphs, which need static shapes: "
                                            f"{'; '.join(blockers)}, or choose compile_mode = default")
