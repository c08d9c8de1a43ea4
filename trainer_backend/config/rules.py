"""Cross-field config rules in one place: combinations the schema's per-field bounds cannot catch.

`problems(cfg)` returns EVERY problem, each a one-line message that starts with the key it is
about (`network.dora: …`), so the GUI shows each under its own field at once; `check(cfg)` raises
the first. `python -m trainer_backend validate`, the trainer (before it loads the model) and the
studio's form (on every change) all run these. Pure: no file system, no torch; the precision and
hardware rules live beside the code they protect and are collected here.
"""
from __future__ import annotations

import importlib.util
from typing import Callable, Iterator

from .base import ConfigError
from .schema import TrainConfig

# optimizer.name -> the package it needs (installed by the user where not by setup.sh)
OPTIMIZER_PACKAGES = {"adamw8bit": "bitsandbytes", "prodigy": "prodigyopt", "lion": "lion_pytorch"}


def _timesteps(cfg: TrainConfig) -> Iterator[str]:
    if cfg.loss.timestep_min >= cfg.loss.timestep_max:
        yield (f"loss.timestep_min: must be below loss.timestep_max ({cfg.loss.timestep_max}), "
               f"got {cfg.loss.timestep_min}")


def _network(cfg: TrainConfig) -> Iterator[str]:
    n = cfg.network
    if n.dora and n.type != "lora":
        yield f"network.dora: DoRA is a LoRA option; network.type is {n.type!r}"
    if n.type == "full" and n.conv_rank:
        yield ("network.conv_rank: conv adapters are an adapter option; a full fine-tune already trains every "
               "convolution (set it to 0)")


def _lora_format(cfg: TrainConfig) -> Iterator[str]:
    from ..families.registry import entry  # pure (no torch); model.arch = auto is checked once the model loads
    fmt, arch = cfg.output.lora_format, cfg.model.arch
    if fmt != "auto" and arch != "auto" and fmt not in entry(arch).lora_layouts:
        yield (f"output.lora_format: {arch} LoRA files are written in {' or '.join(entry(arch).lora_layouts)} "
               f"layout, not {fmt!r}")


def _ema(cfg: TrainConfig) -> Iterator[str]:
    hw = cfg.hardware
    if cfg.ema.enabled and (hw.strategy == "fsdp" or (hw.strategy == "deepspeed" and hw.deepspeed_zero_stage == 3)):
        yield ("ema.enabled: needs whole (unsharded) weights on the main process; not available with FSDP or "
               "DeepSpeed ZeRO-3 (use hardware.strategy = ddp or ZeRO-1/2)")


def _validation(cfg: TrainConfig) -> Iterator[str]:
    if cfg.validation.fraction and cfg.dataset.validation_every_nth:
        yield "validation.fraction: set either validation.fraction or dataset.validation_every_nth"


def _optimizer_package(cfg: TrainConfig) -> Iterator[str]:
    package = OPTIMIZER_PACKAGES.get(cfg.optimizer.name)
    if package and importlib.util.find_spec(package) is None:
        yield (f"optimizer.name: '{cfg.optimizer.name}' needs the '{package}' package "
               f"(.venv/bin/pip install {package}), or choose adamw")


def _precision(cfg: TrainConfig) -> Iterator[str]:
    from ..training.full_half_precision import check_precision_options  # pure (no torch)
    yield from _raised(check_precision_options, cfg)


def _hardware(cfg: TrainConfig) -> Iterator[str]:
    from ..launch.argv import validate_hardware  # pure (no torch)
    yield from _raised(validate_hardware, cfg)


def _raised(check: Callable[[TrainConfig], None], cfg: TrainConfig) -> Iterator[str]:
    try:
        check(cfg)
    except ConfigError as e:
        yield str(e)


RULES: tuple[Callable[[TrainConfig], Iterator[str]], ...] = (
    _timesteps, _network, _lora_format, _ema, _validation, _optimizer_package, _precision, _hardware)


def problems(cfg: TrainConfig) -> list[str]:
    """Every cross-field problem of `cfg`, each naming its key; [] when there is none."""
    return [message for rule in RULES for message in rule(cfg)]


def check(cfg: TrainConfig) -> TrainConfig:
    """Raise ConfigError with the first problem (all of them are in `problems`)."""
    found = problems(cfg)
    if found:
        raise ConfigError(found[0])
    return cfg
