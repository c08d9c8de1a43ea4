"""Cross-field config rules in one place: combinations the schema's per-field bounds cannot catch,
and what `train` would refuse later (an optimizer package that is not installed).

`problems(cfg)` returns EVERY problem as a `Problem(key, message)`, so the studio's form shows each
under its own field at once; `check(cfg)` raises the first as a ConfigError. `python -m
trainer_backend validate`, the trainer (before it loads the model) and the form (on every change)
all run these. Pure and below the rest of the backend: no file system (config/checks.py has those
checks), no torch, nothing from methods/, training/ or launch/; the old entry points there
(`check_precision_options`, `validate_hardware`, …) are thin wrappers over a group of these rules.

Add a rule: a generator of `Problem`s decorated with `@rule("<group>")`, here (or in
config/hardware_rules.py for [hardware] and [precision], config/control_rules.py for paired control images, config/quantize_rules.py for a quantized base).
"""
from __future__ import annotations

import importlib.util
from typing import Callable, Iterator

from . import control_rules, hardware_rules, memory_rules, quantize_rules, video_rules
from .base import Problem
from .schema import TrainConfig

Rule = Callable[[TrainConfig], Iterator[Problem]]
RULES: list[tuple[str, Rule]] = []   # (group, rule), in the order they report

# optimizer.name -> the package it needs (installed by the user where not by setup.sh)
OPTIMIZER_PACKAGES = {"adamw8bit": "bitsandbytes", "paged_adamw8bit": "bitsandbytes", "prodigy": "prodigyopt", "lion": "lion_pytorch"}
TRACKER_PACKAGES = {"wandb": "wandb"}
FLOW_SAMPLERS = ("default", "euler")  # flow-matching families sample with their own Euler scheduler


def rule(group: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES.append((group, fn))
        return fn
    return register


def problems(cfg: TrainConfig, *groups: str) -> list[Problem]:
    """Every cross-field problem of `cfg` (of the given groups only, when named); [] when there is none."""
    every = [*RULES, *hardware_rules.RULES, *control_rules.RULES, *memory_rules.RULES, *quantize_rules.RULES,
             *video_rules.RULES]
    unknown = set(groups) - {g for g, _ in every}
    if unknown:
        raise ValueError(f"no rule group {sorted(unknown)}")
    found: list[Problem] = []
    for group, fn in every:
        if not groups or group in groups:
            found += [p for p in fn(cfg) if p not in found]
    return found


def check(cfg: TrainConfig, *groups: str) -> TrainConfig:
    """Raise ConfigError with the first problem (all of them are in `problems`)."""
    found = problems(cfg, *groups)
    if found:
        raise found[0].error()
    return cfg


def section_applies(cfg: TrainConfig, section: str) -> bool:
    """Does the section apply to this config (its `WHEN`, config/applicability.py)? Rules about a
    section that does not apply (the [samples] of a VAE run) report nothing."""
    from .applicability import applies, values_of
    from .schema import sections
    return applies({k: list(v) for k, v in sections()[section].WHEN.items()}, values_of(cfg))


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


# ----------------------------------------------------------------------------- the rules

@rule("loss")
def _timesteps(cfg: TrainConfig) -> Iterator[Problem]:
    if section_applies(cfg, "loss") and cfg.loss.timestep_min >= cfg.loss.timestep_max:
        yield Problem("loss.timestep_min", f"must be below loss.timestep_max ({cfg.loss.timestep_max}), "
                                           f"got {cfg.loss.timestep_min}")


@rule("network")
def _network(cfg: TrainConfig) -> Iterator[Problem]:
    n = cfg.network
    if n.dora and n.type != "lora":
        yield Problem("network.dora", f"DoRA is a LoRA option; network.type is {n.type!r}")
    if n.training_adapter and n.type != "lora":
        yield Problem("network.training_adapter", f"a training adapter applies to LoRA training (network.type = "
                                                  f"lora); network.type is {n.type!r}")
    if n.training_adapter and n.type == "lora" and n.dora:  # DoRA's norm would see the base without it
        yield Problem("network.training_adapter", "not with network.dora: DoRA rescales the layer's whole output, "
                                                  "the training adapter's update included; use plain LoRA")
    if n.type == "full" and n.conv_rank:
        yield Problem("network.conv_rank", "conv adapters are an adapter option; a full fine-tune already trains "
                                           "every convolution (set it to 0)")


@rule("network")
def _adapter_layers(cfg: TrainConfig) -> Iterator[Problem]:
    """network.block_lr and network.exclude_modules: well-formed (which blocks and modules they name is
    checked once the model is loaded)."""
    import re
    from .block_patterns import pattern_problem
    if cfg.network.type not in ("lora", "loha", "lokr"):
        return
    for key, factor in cfg.network.block_lr.items():
        why = pattern_problem(key)
        if why:
            yield Problem("network.block_lr", why)
        elif factor < 0:
            yield Problem("network.block_lr", f"{key!r}: a multiplier is ≥ 0 (0 freezes the block), got {factor}")
    for pattern in cfg.network.exclude_modules:
        try:
            re.compile(pattern)
        except re.error as e:
            yield Problem("network.exclude_modules", f"{pattern!r} is not a regular expression ({e})")


@rule("family")
def _family(cfg: TrainConfig) -> Iterator[Problem]:
    """What the chosen family cannot do (model.arch = auto is checked once the model loads)."""
    from ..families.registry import entry  # pure (no torch)
    arch = cfg.model.arch
    if arch == "auto":
        return
    family = entry(arch)
    if cfg.model.clip_skip > 1 and not family.clip_skip:
        yield Problem("model.clip_skip", clip_skip_refusal(arch))
    if cfg.network.train_text_encoder and not family.text_encoder_training and cfg.network.type != "vae":
        yield Problem("network.train_text_encoder", text_encoder_refusal(arch))
    fmt = cfg.output.lora_format
    if fmt != "auto" and fmt not in family.lora_layouts:
        yield Problem("output.lora_format", f"{arch} LoRA files are written in {' or '.join(family.lora_layouts)} "
                                            f"layout, not {fmt!r}")
    if family.objective == "flow":
        if section_applies(cfg, "samples") and cfg.samples.scheduler not in FLOW_SAMPLERS:
            yield Problem("samples.scheduler", f"{cfg.samples.scheduler!r} does not apply to {arch} (model.arch); "
                                               f"use euler or default")
        if cfg.model.prediction_type != "auto":
            yield Problem("model.prediction_type", f"{arch} (model.arch) predicts the flow; use \"auto\"")


def text_encoder_refusal(arch: str) -> str:
    """Why network.train_text_encoder does not apply to family `arch` (also said once an auto model loads)."""
    from ..families.registry import entry
    return (f"{entry(arch).label} (model.arch {arch}) keeps its text encoder frozen: its LoRA loaders "
            f"(diffusers, ComfyUI) load the transformer only; turn it off")


def clip_skip_refusal(arch: str) -> str:
    """Why model.clip_skip > 1 does not apply to family `arch` (also said once an auto model loads)."""
    from ..families.registry import entry
    if entry(arch).objective == "ddpm":  # SDXL
        return (f"{arch} (model.arch) already conditions on the penultimate layer of both text encoders, by "
                f"design (kohya's sd-scripts ignore clip_skip for SDXL); set 1")
    return f"{arch} (model.arch) is not conditioned on one CLIP encoder's last layer; set 1"


@rule("ema")
def _ema(cfg: TrainConfig) -> Iterator[Problem]:
    hw = cfg.hardware
    if cfg.ema.enabled and (hw.strategy == "fsdp" or (hw.strategy == "deepspeed" and hw.deepspeed_zero_stage == 3)):
        yield Problem("ema.enabled", "needs whole (unsharded) weights on the main process; not available with FSDP "
                                     "or DeepSpeed ZeRO-3 (use hardware.strategy = ddp or ZeRO-1/2)")


def validation_enabled(cfg: TrainConfig) -> bool:
    return bool(cfg.validation.every_n_steps or cfg.validation.every_n_epochs)


@rule("validation")
def _validation(cfg: TrainConfig) -> Iterator[Problem]:
    val, nth = cfg.validation, cfg.dataset.validation_every_nth
    if val.fraction and nth:
        yield Problem("validation.fraction", "set either validation.fraction or dataset.validation_every_nth")
    if val.path and (val.fraction or nth):
        yield Problem("validation.path", "set either a separate validation folder or a held-out share "
                                         "(validation.fraction / dataset.validation_every_nth), not both")
    if validation_enabled(cfg) and not (val.path or val.fraction or nth):
        key = "validation.every_n_steps" if val.every_n_steps else "validation.every_n_epochs"
        yield Problem(key, "there are no validation images; set validation.path, validation.fraction or "
                           "dataset.validation_every_nth")


@rule("checkpoints")
def _checkpoints(cfg: TrainConfig) -> Iterator[Problem]:
    ck = cfg.checkpoints
    if ck.export_at == "epochs" and not ck.every_n_epochs:
        yield Problem("checkpoints.export_at", "'epochs' exports with the checkpoints of every_n_epochs; set "
                                               "checkpoints.every_n_epochs ≥ 1")
    if ck.keep_best and ck.best_metric == "validation_loss" and not validation_enabled(cfg):
        yield Problem("checkpoints.best_metric", "validation_loss needs validation.every_n_steps or "
                                                 "validation.every_n_epochs")


@rule("samples")
def _samples(cfg: TrainConfig) -> Iterator[Problem]:
    from .sample_prompts import line_problems
    s = cfg.samples
    if not section_applies(cfg, "samples"):
        return
    yield from (Problem(key, message) for key, message in line_problems(cfg, "samples.prompts", s.prompts))
    scheduled = s.every_n_steps or s.every_n_epochs or s.before_first_step
    if scheduled and not s.prompt_file and not any(
            line.strip() and not line.lstrip().startswith("#") for line in s.prompts.splitlines()):
        yield Problem("samples.prompts", "no prompts, but sampling is scheduled (samples.every_n_steps, "
                                         "every_n_epochs or before_first_step); add prompts or samples.prompt_file")


@rule("webhooks")
def _webhooks(cfg: TrainConfig) -> Iterator[Problem]:
    for i, target in enumerate(cfg.webhooks.targets):
        if bool(target.url) == bool(target.url_secret):
            yield Problem(f"webhooks.targets[{i}].url", "set either url or url_secret (exactly one)")


# What train() would import later and fail on: caught before any model loads.

@rule("optimizer_package")
def _optimizer_package(cfg: TrainConfig) -> Iterator[Problem]:
    package = OPTIMIZER_PACKAGES.get(cfg.optimizer.name)
    if package and not installed(package):
        yield Problem("optimizer.name", f"'{cfg.optimizer.name}' needs the '{package}' package "
                                        f"(.venv/bin/pip install {package}), or choose adamw")


@rule("tracker_package")
def _tracker_package(cfg: TrainConfig) -> Iterator[Problem]:
    package = TRACKER_PACKAGES.get(cfg.logging.tracker)
    if package and not installed(package):
        yield Problem("logging.tracker", f"'{cfg.logging.tracker}' needs the {package} package "
                                         f"(.venv/bin/pip install {package}), or set logging.tracker = \"none\"")
