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


def _check_no_overlap(cfg: TrainConfig) -> None:
    """The run folder must not be inside a dataset folder, nor a dataset inside the run folder: the
    run's own samples would become training images, and the next start would see a changed dataset."""
    run = Path(cfg.run_dir).expanduser().resolve()
    folders = [("dataset.path", cfg.dataset.path), ("dataset.class_path", cfg.dataset.class_path),
               *((f"dataset.subsets[{i}].path", s.path) for i, s in enumerate(cfg.dataset.subsets))]
    for key, value in folders:
        if not value or str(value).startswith(BUILTIN_PREFIX):
            continue
        data = Path(value).expanduser().resolve()
        if run == data or run.is_relative_to(data):
            raise ConfigError(f"output.dir: the run folder {run} is inside {key} ({data}); its samples and "
                              f"checkpoints would become training data. Put output.dir elsewhere")
        if data.is_relative_to(run):
            raise ConfigError(f"{key}: {data} is inside the run folder {run} (output.dir/output.name); "
                              f"keep the dataset outside it")


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
    from ..run.run_folder import run_folder_problem  # new, or already a run's: never the user's other files
    problem = run_folder_problem(cfg.run_dir)
    if problem:
        raise ConfigError(problem)
    _check_no_overlap(cfg)
    from ..methods.checks import check_method_config  # the cross-field rules (config/rules.py), then
    check_method_config(cfg)                          # the DreamBooth and sample options that read files
    return cfg
