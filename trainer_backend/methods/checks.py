"""Method options checked before a run starts (`validate_for_run`, `validate` and the trainer call
this), so a bad combination fails in seconds with the key named, not after the model has loaded."""
from __future__ import annotations

from ..config import TrainConfig, rules
from ..config.base import Problem


def method_problems(cfg: TrainConfig) -> list[Problem]:
    """What the methods check on the file system: DreamBooth class images to generate need a prompt."""
    ds = cfg.dataset
    if ds.num_class_images and not ds.class_prompt.strip():
        from .class_images import user_class_images
        found = len(user_class_images(ds.class_path))
        if found < ds.num_class_images:
            return [Problem("dataset.class_prompt", f"required to generate class images (dataset.num_class_images "
                                                    f"= {ds.num_class_images}, {found} found in dataset.class_path)")]
    return []


def check_method_config(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the key: the cross-field rules (config/rules.py), then the method's own."""
    rules.check(cfg)
    for problem in method_problems(cfg):
        raise problem.error()
