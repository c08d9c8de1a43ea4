"""Method options checked before a run starts (the GUI and `validate_for_run` call this), so a
bad combination fails in seconds with the key named, not after the model has loaded."""
from __future__ import annotations

from ..config import ConfigError, TrainConfig


def check_method_config(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the key for method, EMA, DreamBooth and sample options that cannot work."""
    n, ds = cfg.network, cfg.dataset
    if n.dora and n.type != "lora":
        raise ConfigError(f"network.dora: DoRA is a LoRA option; network.type is {n.type!r}")
    if n.type == "full" and n.conv_rank:
        raise ConfigError("network.conv_rank: conv adapters are an adapter option; a full fine-tune already "
                          "trains every convolution (set it to 0)")
    if cfg.ema.enabled and (cfg.hardware.strategy == "fsdp" or (
            cfg.hardware.strategy == "deepspeed" and cfg.hardware.deepspeed_zero_stage == 3)):
        raise ConfigError("ema.enabled: needs whole (unsharded) weights on the main process; not available with "
                          "FSDP or DeepSpeed ZeRO-3 (use hardware.strategy = ddp or ZeRO-1/2)")
    if ds.num_class_images and not ds.class_prompt.strip():
        from .class_images import user_class_images
        found = len(user_class_images(ds.class_path))
        if found < ds.num_class_images:
            raise ConfigError(f"dataset.class_prompt: required to generate class images (dataset.num_class_images "
                              f"= {ds.num_class_images}, {found} found in dataset.class_path)")
    from ..training.sampling import SampleImages, load_prompts
    SampleImages.check_schedule(cfg, load_prompts(cfg))
