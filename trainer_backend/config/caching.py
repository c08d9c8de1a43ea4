"""dataset.cache_auto: cache the VAE latents and the text-encoder outputs when nothing changes them from step
to step, and say why when not (the plan and the log show it). Pure: a config in, a choice out."""
from __future__ import annotations

from dataclasses import dataclass, field

from .schema import TrainConfig


@dataclass(frozen=True)
class CachingChoice:
    latents: bool
    text: bool
    reasons: list[str] = field(default_factory=list)  # one line per decision, for the plan and the log

    def summary(self) -> str:
        return "; ".join(self.reasons) or "latents and text-encoder outputs cached (as asked)"

    def to_dict(self) -> dict:
        return {"latents": self.latents, "text": self.text, "reasons": list(self.reasons)}


def _subset_values(cfg: TrainConfig, key: str) -> list:
    """The value of a [dataset] augmentation option and of every subset that overrides it."""
    own = getattr(cfg.dataset, key)
    values = [own]
    for subset in cfg.dataset.subsets:
        value = getattr(subset, key, "inherit")
        if value not in ("inherit", -1, -1.0):
            values.append(value)
    return values


def latent_blockers(cfg: TrainConfig) -> list[str]:
    """What makes a sample's latents differ between steps (each a reason not to cache them)."""
    out = []
    if cfg.network.type == "vae":
        out.append("a VAE fine-tune trains on the pixels")
    if any(v is False for v in _subset_values(cfg, "center_crop")):
        out.append("a random crop (dataset.center_crop = false) draws a new crop every step")
    if any(v is True for v in _subset_values(cfg, "flip")) and not cfg.dataset.cache_both_flips:
        out.append("dataset.flip without dataset.cache_both_flips flips at random every step")
    from ..families.registry import VIDEO_FAMILIES  # pure
    if cfg.dataset.video_clip_mode == "random" and cfg.model.arch in ("auto", *VIDEO_FAMILIES):
        out.append("dataset.video_clip_mode = random draws a new window of each clip every epoch")
    return out


def text_blockers(cfg: TrainConfig) -> list[str]:
    """What makes a sample's text-encoder output differ between steps."""
    out = []
    if cfg.network.type == "vae":
        out.append("a VAE fine-tune reads no captions")
    if cfg.network.train_text_encoder:
        out.append("the text encoders are trained (network.train_text_encoder)")
    if any(v > 0 for v in _subset_values(cfg, "caption_dropout")):
        out.append("dataset.caption_dropout empties captions at random")
    if any(v is True for v in _subset_values(cfg, "shuffle_tags")):
        out.append("dataset.shuffle_tags reorders tags every step")
    if any(v > 0 for v in _subset_values(cfg, "tag_dropout")):
        out.append("dataset.tag_dropout drops tags at random")
    return out


def auto_caching(cfg: TrainConfig) -> CachingChoice:
    """What dataset.cache_auto turns on, on top of what cache_latents / cache_text_encoder_outputs ask."""
    ds = cfg.dataset
    latents, text, reasons = ds.cache_latents, ds.cache_text_encoder_outputs, []
    if not ds.cache_auto:
        return CachingChoice(latents, text, ["dataset.cache_auto is off: only what cache_latents and "
                                             "cache_text_encoder_outputs ask"])
    if not latents:
        blockers = latent_blockers(cfg)
        latents = not blockers
        reasons.append("latents cached: the same for every step" if latents else
                       f"latents encoded every step: {'; '.join(blockers)}")
    if not text:
        blockers = text_blockers(cfg)
        text = not blockers
        reasons.append("text-encoder outputs cached: captions are static and the encoders frozen" if text else
                       f"captions encoded every step: {'; '.join(blockers)}")
    return CachingChoice(latents, text, reasons)


def static_shape_blockers(cfg: TrainConfig) -> list[str]:
    """What gives the denoiser more than one input shape, or work besides it, in a step: each a reason
    speed.compile_mode = reduce-overhead (CUDA graphs, recorded once per shape) is refused."""
    out = []
    if cfg.dataset.bucketing:
        out.append("dataset.bucketing gives one image size per bucket (set dataset.bucketing = false)")
    if not auto_caching(cfg).latents:
        blockers = latent_blockers(cfg) or ["dataset.cache_latents and dataset.cache_auto are off"]
        out.append(f"latents are encoded every step ({'; '.join(blockers)}; cache them)")
    return out


def with_auto_caching(cfg: TrainConfig) -> TrainConfig:
    """The config with dataset.cache_auto's choice written into cache_latents / cache_text_encoder_outputs
    (what the run's config.toml then records)."""
    choice = auto_caching(cfg)
    if (choice.latents, choice.text) == (cfg.dataset.cache_latents, cfg.dataset.cache_text_encoder_outputs):
        return cfg
    out = cfg.model_copy(deep=True)
    out.dataset.cache_latents, out.dataset.cache_text_encoder_outputs = choice.latents, choice.text
    return out
