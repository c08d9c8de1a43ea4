"""Writing trained adapters as LoRA `.safetensors` files with kohya's ss_* training metadata.

The key layout is the family's (`Family.lora_file_state`: for SD, kohya/webui's
`lora_unet_…`/`lora_te…` keys); the metadata is the same for every family, plus the
family's own stamps (`Family.lora_metadata`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from ..families.registry import entry


def tag_frequency(scan) -> dict[str, dict[str, int]]:
    """kohya's ss_tag_frequency: per subset folder, how often each caption tag occurs."""
    freq: dict[str, dict[str, int]] = {}
    for item in scan.items:
        if getattr(item, "is_class", False):
            continue
        name = scan.groups[item.group].name if getattr(scan, "groups", None) else "dataset"
        counts = freq.setdefault(name, {})
        for tag in item.tags:
            tag = tag.strip()
            if tag:
                counts[tag] = counts.get(tag, 0) + 1
    return freq


def kohya_metadata(cfg, family, *, steps: int, epochs: int, num_images: int,
                   tag_frequency: dict | None = None, started_at: float = 0.0, model=None) -> dict[str, str]:
    """ss_* training metadata as webui/kohya tools read it (all values are strings). With `model`, the
    modelspec.architecture is the loaded variant's (SD3 Medium / SD3.5 Medium / Large, Flux dev / schnell)."""
    meta = {
        "ss_network_module": "networks.lora",
        "ss_network_dim": str(cfg.network.rank),
        "ss_network_alpha": str(cfg.network.alpha),
        "ss_network_dropout": str(cfg.network.dropout),
        "ss_sd_model_name": os.path.basename(cfg.model.path.rstrip("/")),
        "ss_output_name": cfg.output.name,
        "ss_resolution": f"({cfg.dataset.resolution}, {cfg.dataset.resolution})",
        "ss_steps": str(steps),
        "ss_epoch": str(epochs),
        "ss_num_train_images": str(num_images),
        "ss_batch_size_per_device": str(cfg.schedule.batch_size),
        "ss_gradient_accumulation_steps": str(cfg.schedule.grad_accum),
        "ss_learning_rate": str(cfg.optimizer.lr),
        "ss_unet_lr": str(cfg.optimizer.lr),
        "ss_text_encoder_lr": str(cfg.network.text_encoder_lr or cfg.optimizer.lr)
        if cfg.network.train_text_encoder else "0",
        "ss_optimizer": cfg.optimizer.name,
        "ss_lr_scheduler": cfg.optimizer.scheduler,
        "ss_lr_warmup_steps": str(cfg.optimizer.warmup_steps),
        "ss_max_grad_norm": str(cfg.optimizer.max_grad_norm),
        "ss_mixed_precision": cfg.precision.mixed,
        "ss_seed": str(cfg.schedule.seed),
        "ss_noise_offset": str(cfg.loss.noise_offset),
        "ss_min_snr_gamma": str(cfg.loss.min_snr_gamma),
        "ss_training_started_at": str(started_at),
        "ss_tag_frequency": json.dumps(tag_frequency or {}),
        # kohya writes None when clip_skip is not given; families without it never apply one
        "ss_clip_skip": str(cfg.model.clip_skip) if entry(family.name).clip_skip else "None",
    }
    meta.update(family.lora_metadata())  # ss_base_model_version, modelspec.architecture, ...
    meta["ss_network_module"] = family.network_module   # kohya's/musubi's module for this family
    meta.update(modelspec(cfg, family, started_at))
    if model is not None:  # the modelspec convention's adapter suffix, as kohya's sai_model_spec writes it
        meta["modelspec.architecture"] = f"{family.architecture(model)}/lora"
        meta["ss_base_model_version"] = family.base_model_version_of(model)
        prediction = PREDICTION_TYPES.get(getattr(model, "prediction_type", ""))
        if prediction:
            meta["modelspec.prediction_type"] = prediction
    return meta


PREDICTION_TYPES = {"epsilon": "epsilon", "v_prediction": "v"}   # the SAI model spec's names (none for flow)


def modelspec(cfg, family, started_at: float) -> dict[str, str]:
    """The SAI model spec's required fields and the ones kohya's sd-scripts fill for a LoRA (1.0.1:
    title = the output name, the training start as its date, the resolution, the clip skip)."""
    import datetime
    res = cfg.dataset.resolution
    meta = {"modelspec.sai_model_spec": "1.0.1", "modelspec.implementation": family.modelspec_implementation,
            "modelspec.title": cfg.output.name, "modelspec.resolution": f"{res}x{res}",
            "modelspec.date": datetime.datetime.fromtimestamp(int(started_at or 0)).isoformat()}
    if entry(family.name).clip_skip and cfg.model.clip_skip > 1:
        meta["modelspec.encoder_layer"] = str(cfg.model.clip_skip)
    return meta


def save_lora_file(path: Path, model, state_dicts: dict[str, dict[str, torch.Tensor]], *,
                   alpha: float | Callable[[str, str], float], metadata: dict[str, str],
                   layout: str = "auto") -> Path:
    """The family's LoRA file layout (model.family.lora_file_state; `layout` = output.lora_format), written
    atomically (temp file + rename) so a crash never leaves a half file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    family = model.family
    for suffix, states in family.lora_file_parts(model, state_dicts).items():  # one file, unless the family
        target = part_path(path, suffix)                                     # splits it (Wan 2.2's experts)
        tmp = target.with_suffix(".tmp")
        save_file(family.lora_file_state(model, states, alpha, layout), str(tmp), metadata=metadata)
        os.replace(tmp, target)
    return path


def part_path(path: Path, suffix: str) -> Path:
    """A LoRA output's file for one part (Family.lora_file_suffixes): `<stem><suffix>.safetensors`."""
    return path if not suffix else path.with_name(path.stem + suffix + path.suffix)


def lora_output_paths(path: Path, model) -> list[Path]:
    """Every file a LoRA output at `path` is written as (the run's own first)."""
    return [part_path(Path(path), s) for s in model.family.lora_file_suffixes(model)]
