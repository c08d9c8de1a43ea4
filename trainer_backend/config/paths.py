"""Where relative paths in a config point: the working directory, else the project root."""
from __future__ import annotations

from pathlib import Path

from .schema import TrainConfig

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
    cfg.dataset.control_path = resolve_path(cfg.dataset.control_path)
    for subset in cfg.dataset.subsets:
        subset.control_path = resolve_path(subset.control_path)
    if cfg.model.vae:
        cfg.model.vae = resolve_path(cfg.model.vae)
    if cfg.network.training_adapter:
        cfg.network.training_adapter = resolve_path(cfg.network.training_adapter)
    return cfg
