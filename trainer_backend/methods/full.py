"""Full fine-tuning: the UNet (and the text encoders with network.train_text_encoder) are
trained as fp32 master weights while frozen parts stay in the compute dtype; the result is a
diffusers folder plus a single-file original-layout checkpoint."""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from pathlib import Path

import torch

from ..config import TrainConfig
from .base import Trainable, fp32_param_groups

LOG = logging.getLogger("trainer")
SAVE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def setup_full(model, cfg: TrainConfig) -> Trainable:
    model.vae.requires_grad_(False)
    modules: dict[str, torch.nn.Module] = {model.family.denoiser_name: model.denoiser.requires_grad_(True)}
    for encoder in model.text_encoders:
        encoder.requires_grad_(False)
    if cfg.network.train_text_encoder:
        for name, encoder in model.trained_text_encoders():
            modules[name] = encoder.requires_grad_(True)
    groups = fp32_param_groups(modules, cfg.optimizer.lr, cfg.network.text_encoder_lr or cfg.optimizer.lr)
    return Trainable(modules=modules, param_groups=groups, kind="full")


def original_text_encoders(cfg: TrainConfig, model) -> list:
    """The base model's text encoders in fp32, reloaded: the frozen copies used in training were
    cast to the compute dtype (or quantized, model.quantize_text_encoders), and the output must carry
    the original weights, not a rounded copy."""
    src = Path(model.source)
    if src.is_dir():
        return [type(te).from_pretrained(str(src), subfolder=sub, local_files_only=True, dtype=torch.float32)
                for te, sub in zip(model.text_encoders, model.family.text_encoder_names)]
    from ..families import load_configured
    return load_configured(cfg.model).text_encoders


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def save_full_outputs(cfg: TrainConfig, run_dir: Path, model, trainable: Trainable, metadata: dict[str, str],
                      file_name: str = "") -> list[Path]:
    """Final: <name>-diffusers/ (from_pretrained) and <name>.safetensors (from_single_file, webui);
    training is over, so the modules are cast to network.save_precision in place (no second copy).
    Intermediate (file_name given): only that single file, from cast copies; the model is untouched."""
    dtype = SAVE_DTYPES[cfg.network.save_precision]
    encoders = list(model.text_encoders)
    from ..compute.quantize import quantized_kind
    if not cfg.network.train_text_encoder and any(te.dtype != torch.float32 or quantized_kind(te) for te in encoders):
        encoders = original_text_encoders(cfg, model)
    out_model = dataclasses.replace(model, text_encoders=encoders)
    family = model.family
    trained_encoders = cfg.network.train_text_encoder and family.full_single_file == "denoiser"
    if file_name:
        paths = family.save_full_model(out_model, None, Path(run_dir) / file_name, dtype=dtype, metadata=metadata)
        if trained_encoders:  # the single file has no text encoders: the trained ones go beside it
            paths += family.save_text_encoder_files(out_model, Path(run_dir) / file_name, dtype=dtype)
        return paths
    for module in (out_model.denoiser, out_model.vae, *encoders):
        module.to(dtype)
    name = cfg.output.name
    folder = Path(run_dir) / f"{name}-diffusers"
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    paths = family.save_full_model(out_model, tmp, Path(run_dir) / f"{name}.safetensors", metadata=metadata)
    if trained_encoders:
        paths[-1:-1] = family.save_text_encoder_files(out_model, Path(run_dir) / f"{name}.safetensors")
    _replace_dir(tmp, folder)
    LOG.info("saved %s (%s)", ", ".join(str(p) for p in [*paths[:-1], folder]), cfg.network.save_precision)
    return [*paths[:-1], folder]
