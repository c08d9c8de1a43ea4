"""Checks that need the file system (the schema checks types and bounds)."""
from __future__ import annotations

from pathlib import Path

from . import ConfigError, TrainConfig

BUILTIN_PREFIX = "builtin:"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def resolve_path(value: str) -> str:
    """Relative paths are taken from the working directory, else from the project root
    (so the built-in presets' `assets/...` work from anywhere)."""
    if not value or value.startswith(BUILTIN_PREFIX) or Path(value).is_absolute() or Path(value).exists():
        return value
    candidate = PROJECT_ROOT / value
    return str(candidate) if candidate.exists() else value


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    cfg.model.path = resolve_path(cfg.model.path)
    cfg.dataset.path = resolve_path(cfg.dataset.path)
    if cfg.model.vae:
        cfg.model.vae = resolve_path(cfg.model.vae)
    return cfg


def _check_dataset_path(cfg: TrainConfig) -> None:
    if not cfg.dataset.path and not getattr(cfg.dataset, "subsets", None):
        raise ConfigError("dataset.path: required (a folder of images with captions)")
    if cfg.dataset.path and not Path(cfg.dataset.path).is_dir():
        raise ConfigError(f"dataset.path: {cfg.dataset.path} is not a folder")


def validate_dataset_only(cfg: TrainConfig) -> TrainConfig:
    """For `plan` and `inspect`: only what scanning the dataset needs."""
    cfg = resolve_paths(cfg)
    _check_dataset_path(cfg)
    return cfg


def validate_for_run(cfg: TrainConfig) -> TrainConfig:
    """Raise ConfigError naming the key when a required path is missing."""
    cfg = resolve_paths(cfg)
    if not cfg.model.path:
        raise ConfigError("model.path: required (a diffusers folder, a .safetensors file, or builtin:tiny-sd1)")
    if not cfg.model.path.startswith(BUILTIN_PREFIX) and not Path(cfg.model.path).exists():
        raise ConfigError(f"model.path: {cfg.model.path} does not exist")
    if cfg.model.vae and not Path(cfg.model.vae).exists():
        raise ConfigError(f"model.vae: {cfg.model.vae} does not exist")
    _check_dataset_path(cfg)
    if cfg.loss.timestep_min >= cfg.loss.timestep_max:
        raise ConfigError(f"loss.timestep_min: must be below loss.timestep_max ({cfg.loss.timestep_max}), "
                          f"got {cfg.loss.timestep_min}")
    from ..methods.checks import check_method_config  # method, EMA, DreamBooth and sample options
    check_method_config(cfg)
    from ..training.full_half_precision import check_precision_options  # full_bf16/full_fp16, VAE fp16
    check_precision_options(cfg)
    try:
        from ..launch.argv import validate_hardware
    except ImportError:
        return cfg
    validate_hardware(cfg)
    return cfg
