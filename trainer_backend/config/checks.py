"""Checks that need the file system, run before a run starts (the schema checks types and bounds;
config/rules.py the combinations of options)."""
from __future__ import annotations

from pathlib import Path

from . import ConfigError, TrainConfig

from .paths import BUILTIN_PREFIX, PROJECT_ROOT, resolve_path, resolve_paths  # noqa: F401 (re-exported)


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
    from ..methods.checks import check_method_config  # the cross-field rules (config/rules.py), then
    check_method_config(cfg)                          # the DreamBooth and sample options that read files
    return cfg
