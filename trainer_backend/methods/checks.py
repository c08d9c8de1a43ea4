"""Method options checked before a run starts (the GUI and `validate_for_run` call this), so a
bad combination fails in seconds with the key named, not after the model has loaded."""
from __future__ import annotations

from ..config import ConfigError, TrainConfig


def check_method_config(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the key: the cross-field rules (config/rules.py), then the DreamBooth
    and sample options that need files (class images found, the prompt file)."""
    from ..config.rules import check
    check(cfg)
    ds = cfg.dataset
    if ds.num_class_images and not ds.class_prompt.strip():
        from .class_images import user_class_images
        found = len(user_class_images(ds.class_path))
        if found < ds.num_class_images:
            raise ConfigError(f"dataset.class_prompt: required to generate class images (dataset.num_class_images "
                              f"= {ds.num_class_images}, {found} found in dataset.class_path)")
    from ..training.sampling import SampleImages, load_prompts
    SampleImages.check_schedule(cfg, load_prompts(cfg))
