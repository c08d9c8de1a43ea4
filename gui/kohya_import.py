"""Import a kohya_ss GUI config/preset (JSON) as a studio preset.

Every kohya key we can express is mapped; the report lists what was mapped, what was
approximated and why, and every key we do not support that is actually set. Keys whose
target is not (yet) in the schema are reported as unsupported rather than guessed.
Secrets a kohya file may hold (W&B key, Hugging Face token) are never imported.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer_backend.config import ConfigError, TrainConfig, from_dict

from gui.schema_form import form_fields

SECRET_KEYS = {"wandb_api_key", "huggingface_token"}
NETWORK_TYPES = {"standard": "lora", "lycoris/loha": "loha", "lycoris/lokr": "lokr"}
LOCON_TYPES = {"kohya locon", "locon", "lycoris/locon"}   # LoRA plus conv-layer adapters (conv_dim)
SAMPLERS = {"euler": "euler", "euler_a": "euler_a", "k_euler": "euler", "k_euler_a": "euler_a", "ddim": "ddim",
            "dpmsolver++": "dpmpp_2m", "k_dpm_2": "dpmpp_2m", "pndm": "pndm", "ddpm": "ddpm", "unipc": "unipc"}
OPTIMIZERS = {"adamw": "adamw", "adamw8bit": "adamw8bit", "prodigy": "prodigy", "lion": "lion",
              "adafactor": "adafactor", "sgd": "sgd"}
APPROX_OPTIMIZERS = {"pagedadamw8bit": "adamw8bit", "pagedadamw": "adamw", "lion8bit": "lion",
                     "pagedlion8bit": "lion", "sgdnesterov": "sgd", "sgdnesterov8bit": "sgd",
                     "adamw_schedulefree": "adamw", "prodigyplus.prodigyplusschedulefree": "prodigy"}


class ImportProblem(ValueError):
    pass


@dataclass
class KohyaImport:
    data: dict = field(default_factory=dict)                          # sparse studio config
    mapped: list[tuple[str, str, Any]] = field(default_factory=list)  # kohya key, studio key, value
    notes: list[str] = field(default_factory=list)                    # approximations, in words
    unsupported: list[tuple[str, Any]] = field(default_factory=list)  # set in the file, not expressible
    unset: list[str] = field(default_factory=list)                    # unsupported but off/empty: harmless

    def config(self) -> TrainConfig:
        return from_dict(self.data)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _off(value: Any) -> bool:
    """Values kohya uses for 'not set'."""
    if _blank(value) or value is False:
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return True
    return isinstance(value, str) and value.strip().lower() in ("0", "0.0", "none", "false")


def _num(value: Any) -> float:
    return float(str(value).strip())


def _int(value: Any) -> int:
    return int(round(_num(value)))


def _resolution(value: Any) -> int:
    """kohya's "W,H" -> one side: the square with the same area, on a multiple of 8."""
    parts = [int(p) for p in re.split(r"[,x ]+", str(value).strip()) if p]
    side = parts[0] if len(parts) == 1 or parts[0] == parts[1] else math.sqrt(parts[0] * parts[1])
    return int(round(side / 8) * 8)


def _name(value: Any) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._ -]+", "-", str(value).strip()).lstrip("._ -")
    return cleaned or "imported"


# kohya key -> (studio key, converter). Converters raise ValueError for values we cannot use.
DIRECT: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "pretrained_model_name_or_path": ("model.path", str),
    "vae": ("model.vae", str),
    "train_data_dir": ("dataset.path", str),
    "max_resolution": ("dataset.resolution", _resolution),
    "caption_extension": ("dataset.caption_extension", str),
    "flip_aug": ("dataset.flip", bool),
    "random_crop": ("dataset.center_crop", lambda v: not bool(v)),
    "caption_dropout_rate": ("dataset.caption_dropout", _num),
    "shuffle_caption": ("dataset.shuffle_tags", bool),
    "keep_tokens": ("dataset.keep_tokens", _int),
    "cache_latents": ("dataset.cache_latents", bool),
    "max_data_loader_n_workers": ("dataset.num_workers", _int),
    "network_dim": ("network.rank", _int),
    "network_alpha": ("network.alpha", _num),
    "network_dropout": ("network.dropout", _num),
    "learning_rate": ("optimizer.lr", _num),
    "lr_scheduler_num_cycles": ("optimizer.lr_cycles", _int),
    "lr_warmup_steps": ("optimizer.warmup_steps", _int),
    "max_grad_norm": ("optimizer.max_grad_norm", _num),
    "train_batch_size": ("schedule.batch_size", _int),
    "gradient_accumulation_steps": ("schedule.grad_accum", _int),
    "epoch": ("schedule.epochs", _int),
    "max_train_steps": ("schedule.max_steps", _int),
    "seed": ("schedule.seed", _int),
    "noise_offset": ("loss.noise_offset", _num),
    "min_snr_gamma": ("loss.min_snr_gamma", _num),
    "min_timestep": ("loss.timestep_min", _int),
    "max_timestep": ("loss.timestep_max", _int),
    "mixed_precision": ("precision.mixed", str),
    "gradient_checkpointing": ("precision.gradient_checkpointing", bool),
    "num_processes": ("hardware.num_processes", _int),
    "gpu_ids": ("hardware.gpu_ids", lambda v: str(v).replace(" ", "")),
    "save_every_n_steps": ("checkpoints.every_n_steps", _int),
    "save_every_n_epochs": ("checkpoints.every_n_epochs", _int),
    "prior_loss_weight": ("dataset.prior_loss_weight", _num),
    "reg_data_dir": ("dataset.class_path", str),
    "sample_every_n_steps": ("samples.every_n_steps", _int),
    "sample_every_n_epochs": ("samples.every_n_epochs", _int),
    "sample_prompts": ("samples.prompts", str),
    "output_dir": ("output.dir", str),
    "output_name": ("output.name", _name),
    "resume": ("checkpoints.resume", str),
}
# Keys handled by the special cases below (so they are not reported as unsupported).
SPECIAL = {"LoRA_type", "sdxl", "v2", "v_parameterization", "optimizer", "optimizer_args", "lr_scheduler",
           "lr_warmup", "max_train_epochs", "unet_lr", "text_encoder_lr", "learning_rate_te",
           "network_train_unet_only", "xformers", "noise_offset_type", "enable_bucket", "conv_dim", "conv_alpha",
           "sample_sampler", "dora_wd"}


class _Builder:
    def __init__(self) -> None:
        self.result = KohyaImport()
        self.known = {f.dotted for f in form_fields()}

    def put(self, kohya_key: str, dotted: str, value: Any) -> None:
        if dotted not in self.known:
            self.result.unsupported.append((kohya_key, value))
            return
        section, key = dotted.split(".", 1)
        self.result.data.setdefault(section, {})[key] = value
        self.result.mapped = [m for m in self.result.mapped if m[1] != dotted] + [(kohya_key, dotted, value)]

    def note(self, text: str) -> None:
        self.result.notes.append(text)


def _special_cases(src: dict, b: _Builder) -> None:
    arch = "sdxl" if src.get("sdxl") else "sd2" if src.get("v2") else "sd1"
    if any(k in src for k in ("sdxl", "v2")):
        b.put("sdxl/v2", "model.arch", arch)
    if src.get("v_parameterization"):
        b.put("v_parameterization", "model.prediction_type", "v_prediction")

    lora_type = str(src.get("LoRA_type", "")).strip()
    if lora_type:
        low = lora_type.lower()
        if low in NETWORK_TYPES:
            b.put("LoRA_type", "network.type", NETWORK_TYPES[low])
        elif low in LOCON_TYPES:
            b.put("LoRA_type", "network.type", "lora")
            if not _off(src.get("conv_dim")):
                b.put("conv_dim", "network.conv_rank", _int(src["conv_dim"]))
                if not _off(src.get("conv_alpha")):
                    b.put("conv_alpha", "network.conv_alpha", _num(src["conv_alpha"]))
            else:
                b.note(f"LoRA_type {lora_type!r} without conv_dim: imported as plain LoRA")
        else:
            b.result.unsupported.append(("LoRA_type", lora_type))
    elif "network_dim" not in src:
        b.put("(no LoRA_type)", "network.type", "full")
        b.note("no LoRA settings in the file: imported as a full fine-tune (kohya's DreamBooth/Finetune tab)")

    if "optimizer" in src and not _blank(src["optimizer"]):
        low = str(src["optimizer"]).strip().lower()
        if low in OPTIMIZERS:
            b.put("optimizer", "optimizer.name", OPTIMIZERS[low])
        elif low in APPROX_OPTIMIZERS:
            b.put("optimizer", "optimizer.name", APPROX_OPTIMIZERS[low])
            b.note(f"optimizer {src['optimizer']!r} imported as {APPROX_OPTIMIZERS[low]!r}")
        else:
            b.result.unsupported.append(("optimizer", src["optimizer"]))
    _optimizer_args(src.get("optimizer_args", ""), b)

    if src.get("dora_wd"):
        b.put("dora_wd", "network.dora", True)
    sampler = str(src.get("sample_sampler", "")).strip().lower()
    if sampler:
        if sampler in SAMPLERS:
            b.put("sample_sampler", "samples.scheduler", SAMPLERS[sampler])
        else:
            b.result.unsupported.append(("sample_sampler", src["sample_sampler"]))

    scheduler = str(src.get("lr_scheduler", "")).strip()
    if scheduler:
        choices = next(f.choices for f in form_fields() if f.dotted == "optimizer.scheduler")
        if scheduler in choices:
            b.put("lr_scheduler", "optimizer.scheduler", scheduler)
        else:
            b.result.unsupported.append(("lr_scheduler", scheduler))

    if not _off(src.get("max_train_epochs")):
        b.put("max_train_epochs", "schedule.epochs", _int(src["max_train_epochs"]))
    if not _off(src.get("unet_lr")) and "network_dim" in src:
        b.put("unet_lr", "optimizer.lr", _num(src["unet_lr"]))
    te_lr = src.get("text_encoder_lr", src.get("learning_rate_te"))
    te_key = "text_encoder_lr" if "text_encoder_lr" in src else "learning_rate_te"
    if not _off(te_lr):
        b.put(te_key, "network.text_encoder_lr", _num(te_lr))
    if "network_dim" in src:
        train_te = not src.get("network_train_unet_only", False) and not _off(te_lr)
        b.put("network_train_unet_only/text_encoder_lr", "network.train_text_encoder", train_te)

    warmup = src.get("lr_warmup")
    if not _off(warmup) and _off(src.get("lr_warmup_steps")):
        steps = src.get("max_train_steps")
        if not _off(steps):
            b.put("lr_warmup", "optimizer.warmup_steps", int(round(_num(warmup) / 100 * _num(steps))))
            b.note(f"lr_warmup {warmup}% of max_train_steps converted to optimizer.warmup_steps")
        else:
            b.result.unsupported.append(("lr_warmup", f"{warmup}% (needs max_train_steps to convert)"))

    attention = str(src.get("xformers", "")).strip().lower()
    if attention in ("xformers", "sdpa"):
        b.put("xformers", "precision.attention", "sdpa")
        if attention == "xformers":
            b.note("xformers attention imported as PyTorch SDPA (same memory class, no extra package)")
    elif attention == "none":
        b.put("xformers", "precision.attention", "default")

    if not _off(src.get("noise_offset")) and str(src.get("noise_offset_type", "Original")) != "Original":
        b.result.unsupported.append(("noise_offset_type", src["noise_offset_type"]))
    if src.get("enable_bucket") is False:
        b.note("enable_bucket was off in kohya; the studio decides bucketing itself")


def _optimizer_args(text: Any, b: _Builder) -> None:
    """kohya's free-text `weight_decay=0.1 betas=0.9,0.99 eps=1e-8` -> our optimizer fields."""
    for token in str(text or "").split():
        key, sep, value = token.partition("=")
        try:
            if key == "weight_decay":
                b.put("optimizer_args weight_decay", "optimizer.weight_decay", _num(value))
            elif key == "betas":
                beta1, beta2 = (_num(v) for v in value.split(","))
                b.put("optimizer_args betas", "optimizer.beta1", beta1)
                b.put("optimizer_args betas", "optimizer.beta2", beta2)
            elif key == "eps":
                b.put("optimizer_args eps", "optimizer.eps", _num(value))
            else:
                b.result.unsupported.append((f"optimizer_args {key}", value if sep else True))
        except ValueError:
            b.result.unsupported.append((f"optimizer_args {key}", value))


def import_kohya(source: str | dict) -> KohyaImport:
    """A kohya_ss JSON config (text or parsed) -> sparse studio config plus a report.
    The returned `data` always validates: values the schema rejects are moved to `unsupported`."""
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except json.JSONDecodeError as e:
            raise ImportProblem(f"not a kohya_ss JSON file: {e.msg} at line {e.lineno}") from None
    if not isinstance(source, dict):
        raise ImportProblem("not a kohya_ss JSON config: expected an object of settings")
    b = _Builder()
    for key, value in source.items():
        if key in SECRET_KEYS:
            if not _blank(value):
                b.note(f"{key} is a secret and was not imported (set it in the environment or the GUI)")
            continue
        if key in DIRECT:
            dotted, convert = DIRECT[key]
            if _blank(value) or (_off(value) and convert is not bool and dotted != "dataset.center_crop"
                                 and key != "seed"):
                continue
            try:
                b.put(key, dotted, convert(value))
            except (TypeError, ValueError):
                b.result.unsupported.append((key, value))
        elif key not in SPECIAL:
            if _off(value):
                b.result.unset.append(key)
            else:
                b.result.unsupported.append((key, value))
    _special_cases(source, b)
    _drop_invalid(b)
    return b.result


def _drop_invalid(b: _Builder) -> None:
    """Validate; move each value the schema rejects into `unsupported` with the reason."""
    for _ in range(len(b.result.mapped) + 1):
        try:
            from_dict(b.result.data)
            return
        except ConfigError as e:
            dotted = str(e).split(":", 1)[0]
            section, _, key = dotted.partition(".")
            if key not in b.result.data.get(section, {}):
                raise ImportProblem(str(e)) from None
            value = b.result.data[section].pop(key)
            if not b.result.data[section]:
                del b.result.data[section]
            kohya = [m[0] for m in b.result.mapped if m[1] == dotted]
            b.result.mapped = [m for m in b.result.mapped if m[1] != dotted]
            b.result.unsupported.append((kohya[0] if kohya else dotted, f"{value!r} rejected: {e}"))


def report_markdown(result: KohyaImport) -> str:
    lines = [f"**Mapped {len(result.mapped)} settings**", ""]
    lines += [f"- `{k}` → `{d}` = `{v!r}`" for k, d, v in result.mapped]
    if result.notes:
        lines += ["", "**Approximations and notes**", ""] + [f"- {n}" for n in result.notes]
    if result.unsupported:
        lines += ["", f"**Not supported ({len(result.unsupported)}, set in the file, not imported)**", ""]
        lines += [f"- `{k}` = `{v!r}`" for k, v in result.unsupported]
    if result.unset:
        lines += ["", f"Also not supported but off/empty in the file ({len(result.unset)}): "
                  + ", ".join(f"`{k}`" for k in result.unset)]
    return "\n".join(lines)
