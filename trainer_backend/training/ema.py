"""Exponential moving average of the trainable weights (full fine-tune or adapters).

The EMA lives on the main process only (samples and outputs are made there), in fp32, on the
CPU (system RAM, to save VRAM) or next to the weights. It is updated every N optimizer steps
with decay^N, so `ema.decay` keeps meaning "per optimizer step" whatever N is. accelerate's
checkpoint hooks save it as `ema.safetensors` in every checkpoint and restore it on resume; a
checkpoint without one (EMA switched on later) starts the EMA from the resumed weights.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

import torch

from ..config import TrainConfig

LOG = logging.getLogger("trainer")
EMA_FILE = "ema.safetensors"


def effective_decay(decay: float, every_n_steps: int) -> float:
    """Decay applied per update when updating every N steps: the same time constant in steps."""
    return decay ** every_n_steps


def ema_update_(shadow: torch.Tensor, value: torch.Tensor, decay: float) -> None:
    """shadow <- decay * shadow + (1 - decay) * value, in place."""
    shadow.lerp_(value.to(shadow.device, shadow.dtype), 1.0 - decay)


def ema_device(placement: str, param_device: torch.device) -> torch.device:
    return torch.device("cpu") if placement == "cpu" else torch.device(param_device)


class EMA:
    """EMA of named parameters. `active=False` (non-main processes) makes every call a no-op."""

    def __init__(self, params: dict[str, torch.nn.Parameter], decay: float, every_n_steps: int = 1,
                 placement: str = "cpu", active: bool = True):
        self.params, self.decay, self.every_n_steps = params, decay, every_n_steps
        self.placement, self.active = placement, active
        self.updates = 0
        self.needs_init = False
        self.shadow: dict[str, torch.Tensor] = {}
        if active:
            with torch.no_grad():
                self.shadow = {name: p.detach().to(ema_device(placement, p.device), torch.float32, copy=True)
                               for name, p in params.items()}

    def step(self, global_step: int) -> bool:
        """Call after every optimizer step; updates when global_step is a multiple of every_n_steps."""
        if not self.active or global_step % self.every_n_steps:
            return False
        with torch.no_grad():
            if self.needs_init:  # EMA switched on for a run resumed from a checkpoint without one
                for name, p in self.params.items():
                    self.shadow[name].copy_(p.detach())
                self.needs_init = False
            decay = effective_decay(self.decay, self.every_n_steps)
            for name, p in self.params.items():
                ema_update_(self.shadow[name], p.detach(), decay)
        self.updates += 1
        return True

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().contiguous() for k, v in self.shadow.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor], updates: int = 0) -> None:
        missing = set(self.shadow) - set(state)
        if missing:
            raise RuntimeError(f"the checkpoint's EMA does not match the trained parameters (missing "
                               f"{sorted(missing)[0]}); was network.* changed?")
        with torch.no_grad():
            for name, tensor in self.shadow.items():
                tensor.copy_(state[name])
        self.updates, self.needs_init = updates, False

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file
        if self.active:
            save_file(self.state_dict(), str(Path(folder) / EMA_FILE),
                      metadata={"updates": str(self.updates), "decay": str(self.decay),
                                "every_n_steps": str(self.every_n_steps)})

    def load(self, folder: Path) -> None:
        from safetensors import safe_open
        from safetensors.torch import load_file
        if not self.active:
            return
        path = Path(folder) / EMA_FILE
        if not path.is_file():
            LOG.warning("ema: %s has no EMA state; the EMA starts from the resumed weights", folder)
            self.needs_init = True
            return
        with safe_open(str(path), framework="pt") as f:
            updates = int((f.metadata() or {}).get("updates", 0))
        self.load_state_dict(load_file(str(path)), updates)

    # ------------------------------------------------------------------ using the EMA weights

    def copy_to_params(self) -> None:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(self.shadow[name].to(p.device, p.dtype))

    @contextlib.contextmanager
    def applied(self, enabled: bool = True) -> Iterator[None]:
        """Temporarily put the EMA weights into the model (e.g. for samples), then restore."""
        if not (enabled and self.active):
            yield
            return
        with torch.no_grad():
            stash = {name: p.detach().to("cpu", copy=True) for name, p in self.params.items()}
        try:
            self.copy_to_params()
            yield
        finally:
            with torch.no_grad():
                for name, p in self.params.items():
                    p.copy_(stash[name].to(p.device))


class NoEMA:
    """Stands in when ema.enabled is off, so the loop calls the same methods either way."""
    active = False

    def step(self, global_step: int) -> bool:
        return False

    def copy_to_params(self) -> None:
        pass

    @contextlib.contextmanager
    def applied(self, enabled: bool = True) -> Iterator[None]:
        yield


def make_ema(cfg: TrainConfig, trainable, accelerator) -> EMA | NoEMA:
    """The run's EMA, saved into and restored from checkpoints through accelerate's state hooks
    (methods.checks refuses sharded strategies, where the main process lacks whole weights)."""
    if not cfg.ema.enabled:
        return NoEMA()
    ema = EMA(trainable.named_parameters(), cfg.ema.decay, cfg.ema.every_n_steps, cfg.ema.device,
              active=accelerator.is_main_process)
    accelerator.register_save_state_pre_hook(lambda models, weights, output_dir: ema.save(output_dir))
    accelerator.register_load_state_pre_hook(lambda models, input_dir: ema.load(input_dir))
    if ema.active:
        size = sum(t.numel() * t.element_size() for t in ema.shadow.values())
        LOG.info("ema: decay %s every %d step(s) on %s (%.1f MB)", cfg.ema.decay, cfg.ema.every_n_steps,
                 cfg.ema.device, size / 2**20)
    return ema
