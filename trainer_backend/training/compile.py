"""speed.compile = "blocks": regional torch.compile of the denoiser (docs/performance.md).

Each of the family's blocks (`Family.blocks`: UNet down/mid/up blocks, transformer blocks) is compiled in
place with `nn.Module.compile`, after the adapters are added and the model is prepared, so peft's LoRA layers
are traced inside each block. Dynamo treats a block's weights as graph inputs (inline_inbuilt_nn_modules), so
the 19 identical double blocks of Flux reuse one graph; a new image-size bucket adds one graph per block kind.
`CompileWatch` reports that: the first step is a "compiling" phase of its own (an event the Run page shows),
and any later step that compiled again says so in the log, with torch's own recompilation reasons.
compile_mode = reduce-overhead adds CUDA graphs (config/caching.py's static_shape_blockers lists what refuses
them); each optimizer step then starts a new graph generation, so last step's outputs may be overwritten.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from ..config import ConfigError, TrainConfig
from ..run.contract import Event

LOG = logging.getLogger("trainer")


def compile_cache_dir(cfg: TrainConfig) -> Path:
    """speed.compile_cache_dir, else $SD_STUDIO_CACHE/inductor, else ~/.cache/sd-studio/inductor."""
    if cfg.speed.compile_cache_dir:
        return Path(cfg.speed.compile_cache_dir).expanduser()
    base = os.environ.get("SD_STUDIO_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "sd-studio") / "inductor"


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (all regions)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def cuda_graphs_allowed(cfg: TrainConfig, device) -> bool:
    """compile_mode = reduce-overhead on a CUDA device; ConfigError on any other (the config rule catches
    hardware.cpu; this is a run that found no CUDA device at its start)."""
    if cfg.speed.compile_mode != "reduce-overhead":
        return False
    from ..compute.devices import device_kind, is_cuda
    if not is_cuda(device or "cpu"):
        raise ConfigError(f"speed.compile_mode: reduce-overhead records CUDA graphs and this run's device is "
                          f"{device_kind(device or 'cpu')}: choose compile_mode = default")
    return True


def compile_blocks(cfg: TrainConfig, model, events=None, device=None) -> "CompileWatch":
    """Compile each denoiser block in place; the watch does nothing when speed.compile is off."""
    if cfg.speed.compile == "off" or model.denoiser is None:
        return CompileWatch(None, 0, enabled=False)
    graphs = cuda_graphs_allowed(cfg, device)
    import torch._dynamo
    import torch._functorch.config
    import torch._inductor.config
    cache = compile_cache_dir(cfg)
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # read lazily by inductor, at its first compile
    torch._inductor.config.fx_graph_cache = True  # compiled kernels reused across runs ...
    torch._functorch.config.enable_autograd_cache = True  # ... and the backward graphs too
    torch._dynamo.config.recompile_limit = cfg.speed.compile_max_graphs
    torch._logging.set_logs(recompiles=True)  # torch says why a block compiled again (into train.log)
    blocks = model.family.blocks(model)
    mode = None if cfg.speed.compile_mode == "default" else cfg.speed.compile_mode
    for block in blocks:
        block.compile(mode=mode, dynamic=False)
    kinds = len({type(b) for b in blocks})
    LOG.info("speed.compile: %d denoiser blocks of %d kinds compiled region by region (mode %s, cache %s)",
             len(blocks), kinds, cfg.speed.compile_mode, cache)
    return CompileWatch(events, len(blocks), cuda_graphs=graphs)


class CompileWatch:
    """Around each optimizer step: the first one is the compile phase; later new graphs are recompilations."""

    def __init__(self, events, blocks: int, enabled: bool = True, cuda_graphs: bool = False):
        self.events, self.blocks, self.enabled, self.cuda_graphs = events, blocks, enabled, cuda_graphs
        self.graphs, self.started, self.first = graphs_compiled() if enabled else 0, 0.0, True
        self.recompiled_steps = 0

    def before_step(self, step: int) -> None:
        if not self.enabled:
            return
        self.graphs, self.started = graphs_compiled(), time.perf_counter()
        if self.cuda_graphs:  # a new generation of CUDA graph replays: the last step's outputs are no longer read
            torch.compiler.cudagraph_mark_step_begin()
        if self.first and self.events is not None:
            self.events.emit(Event.COMPILE, step=step, status="started", blocks=self.blocks)
            LOG.info("compiling the denoiser's blocks during the first step (this step takes longer)")

    def after_step(self, step: int) -> None:
        if not self.enabled:
            return
        new = graphs_compiled() - self.graphs
        seconds = round(time.perf_counter() - self.started, 2)
        if self.first:
            self.first = False
            LOG.info("compiled %d graphs for %d blocks in %.1f s (first step)", new, self.blocks, seconds)
            if self.events is not None:
                self.events.emit(Event.COMPILE, step=step, status="done", graphs=new, seconds=seconds)
        elif new:
            self.recompiled_steps += 1
            LOG.warning("step %d compiled %d new graph(s) in %.1f s: a new input shape (one per image-size bucket "
                        "is expected; torch's reasons are in the log above)", step, new, seconds)
            if self.events is not None:
                self.events.emit(Event.COMPILE, step=step, status="recompiled", graphs=new, seconds=seconds)
