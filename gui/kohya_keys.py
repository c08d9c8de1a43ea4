"""kohya_ss GUI keys and values: the tables and value converters the importer uses (pure)."""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

SECRET_KEYS = {"wandb_api_key", "huggingface_token"}
NETWORK_TYPES = {"standard": "lora", "flux1": "lora", "lycoris/loha": "loha", "lycoris/lokr": "lokr"}
# kohya values that equal what the studio does anyway: "mapped (default)" in the report, not a warning
# (key -> {value as kohya writes it, lower case: why it is the studio's default})
KOHYA_DEFAULTS = {
    "loss_type": {"l2": "the studio's loss is the mean squared error (L2)"},
    "save_model_as": {"safetensors": "the studio writes .safetensors files"},
    "sdxl_no_half_vae": {"true": "the studio runs the VAE in fp32 (no half-precision VAE to turn off)",
                         "false": "the studio runs the VAE in fp32"},
}
LOCON_TYPES = {"kohya locon", "locon", "lycoris/locon"}   # LoRA plus conv-layer adapters (conv_dim)
SAMPLERS = {"euler": "euler", "euler_a": "euler_a", "k_euler": "euler", "k_euler_a": "euler_a", "ddim": "ddim",
            "dpmsolver++": "dpmpp_2m", "k_dpm_2": "dpmpp_2m", "pndm": "pndm", "ddpm": "ddpm", "unipc": "unipc"}
OPTIMIZERS = {"adamw": "adamw", "adamw8bit": "adamw8bit", "pagedadamw8bit": "paged_adamw8bit", "prodigy": "prodigy",
              "lion": "lion", "adafactor": "adafactor", "sgd": "sgd"}
APPROX_OPTIMIZERS = {"pagedadamw": "adamw", "lion8bit": "lion",
                     "pagedlion8bit": "lion", "sgdnesterov": "sgd", "sgdnesterov8bit": "sgd",
                     "adamw_schedulefree": "adamw", "prodigyplus.prodigyplusschedulefree": "prodigy"}


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true") or value == 1


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
    """A finite number ("inf", "nan", "1e400" and text are a ValueError naming the value)."""
    if isinstance(value, (dict, list)) or isinstance(value, bool):
        raise ValueError("not a number")
    number = float(str(value).strip())
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def _int(value: Any) -> int:
    number = _num(value)
    if abs(number) > 2 ** 53:
        raise ValueError("out of range")
    return int(round(number))


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
    "enable_bucket": ("dataset.bucketing", bool),
    "bucket_no_upscale": ("dataset.bucket_no_upscale", bool),
    "bucket_reso_steps": ("dataset.bucket_step", _int),
    "min_bucket_reso": ("dataset.bucket_min_side", _int),
    "max_bucket_reso": ("dataset.bucket_max_side", _int),
    "max_token_length": ("dataset.max_token_length", _int),
    "cache_latents_to_disk": ("dataset.cache_latents_to_disk", bool),
    "sdxl_cache_text_encoder_outputs": ("dataset.cache_text_encoder_outputs", bool),
    "cache_text_encoder_outputs": ("dataset.cache_text_encoder_outputs", bool),
    "save_precision": ("network.save_precision", lambda v: {"float": "fp32"}.get(str(v).strip(), str(v).strip())),
    "full_bf16": ("precision.full_bf16", bool),
    "fused_backward_pass": ("optimizer.fused_backward", bool),  # sd-scripts' names (docs/memory.md)
    "blocks_to_swap": ("memory.block_swap", _int),
    "full_fp16": ("precision.full_fp16", bool),
    "num_machines": ("hardware.num_machines", _int),
    "main_process_port": ("hardware.main_process_port", _int),
    # the flow-matching families (SD3, Flux)
    "discrete_flow_shift": ("loss.flow_shift", _num),
    "guidance_scale": ("model.guidance", _num),
    "t5xxl_max_token_length": ("model.t5_max_length", _int),
    "lora_network_weights": ("network.network_weights", str),
    "network_weights": ("network.network_weights", str),
    "masked_loss": ("loss.masked", bool),
    # kohya's fp8 base (the frozen U-Net/transformer stored in float8): our float8 weight-only quantization
    "fp8_base": ("model.quantize", lambda v: "float8" if _truthy(v) else "none"),
    "fp8_base_unet": ("model.quantize", lambda v: "float8" if _truthy(v) else "none"),
}
# Keys handled by the special cases below (so they are not reported as unsupported).
SPECIAL = {"LoRA_type", "sdxl", "v2", "v_parameterization", "optimizer", "optimizer_args", "lr_scheduler",
           "lr_warmup", "max_train_epochs", "unet_lr", "text_encoder_lr", "learning_rate_te",
           "network_train_unet_only", "xformers", "noise_offset_type", "conv_dim", "conv_alpha",
           "sample_sampler", "dora_wd", "sdxl_checkbox", "sd3_checkbox", "flux1_checkbox", "timestep_sampling",
           "weighting_scheme", "model_prediction_type", "clip_skip", "alpha_mask", "conditioning_data_dir",
           "down_lr_weight", "mid_lr_weight", "up_lr_weight", "block_lr_zero_threshold",
           "clip_l", "clip_g", "t5xxl", "ae"}


# kohya_ss keys that mark a flow-matching family -> model.arch
FAMILY_KEYS = {"sd3_checkbox": "sd3", "flux1_checkbox": "flux"}
# families kohya_ss has no key for, conditioned on Qwen3-VL: chosen in the studio's import (import_kohya's
# `family`); kohya's flow keys (timestep_sampling, weighting_scheme, discrete_flow_shift, ae, fp8_base,
# t5xxl_max_token_length as tokens per caption) map as for SD3/Flux, these mean nothing for them ({label}: the
# family's name): reported as ignored, with the reason
_FAMILY_KEY = "the family chosen for this import is {label}, which kohya_ss has no key for"
_BLOCKS = "kohya's U-Net block weights; {label} is a transformer (network.block_lr takes its block names)"
_TEXT = "{label} reads Qwen3-VL, not CLIP/T5: give its text-encoder file as model.text_encoder"
QWEN3VL_IGNORED = {
    "sdxl": _FAMILY_KEY, "sdxl_checkbox": _FAMILY_KEY, "v2": _FAMILY_KEY, "sd3_checkbox": _FAMILY_KEY,
    "flux1_checkbox": _FAMILY_KEY, "clip_l": _TEXT, "clip_g": _TEXT, "t5xxl": _TEXT,
    "apply_t5_attn_mask": "{label}'s captions are masked as its pipeline masks them (no T5)",
    "v_parameterization": "{label} predicts the flow (noise − image), not v",
    "guidance_scale": "Flux.1 dev's distilled-guidance input; {label} has none (samples.cfg_scale guides samples)",
    "clip_skip": "{label} is not conditioned on a CLIP encoder's last layer",
    "down_lr_weight": _BLOCKS, "mid_lr_weight": _BLOCKS, "up_lr_weight": _BLOCKS, "block_lr_zero_threshold": _BLOCKS,
}
CHOSEN_FAMILY_IGNORED = {"krea2": QWEN3VL_IGNORED, "qwen_image21": QWEN3VL_IGNORED, "ideogram4": QWEN3VL_IGNORED}
# the separate component files kohya_ss names for SD3/Flux -> the [model] options that load them
COMPONENT_FILES = {"clip_l": "model.clip_l", "clip_g": "model.clip_g", "t5xxl": "model.t5", "ae": "model.vae"}
# kohya's timestep_sampling -> (loss.timestep_sampling, loss.flow_shift or None to leave it);
# "shift" keeps discrete_flow_shift, "flux_shift" is Flux's resolution-dependent shift (flow_shift 0)
TIMESTEP_SAMPLING = {"sigmoid": ("sigmoid", None), "uniform": ("uniform", 1.0), "sigma": ("uniform", 1.0),
                     "shift": ("sigmoid", None), "flux_shift": ("sigmoid", 0.0), "logit_normal": ("logit_normal", None)}
# SD3's weighting_scheme names a timestep density or a loss weighting
WEIGHTING_SCHEME = {"logit_normal": ("loss.timestep_sampling", "logit_normal"),
                    "mode": ("loss.timestep_sampling", "mode"), "uniform": ("loss.timestep_sampling", "uniform"),
                    "sigma_sqrt": ("loss.flow_weighting", "sigma_sqrt"), "cosmap": ("loss.flow_weighting", "cosmap"),
                    "none": ("loss.flow_weighting", "none")}


# kohya's block-wise LR weights (networks/lora.py): blocks per down/up list and in the middle
BLOCK_COUNTS = {"sdxl": (9, 3)}
BLOCK_COUNTS_DEFAULT = (12, 1)   # SD1, SD2
BLOCK_CURVES = {
    "cosine": lambda n: [math.sin(math.pi * (i / (n - 1)) / 2) for i in reversed(range(n))],
    "sine": lambda n: [math.sin(math.pi * (i / (n - 1)) / 2) for i in range(n)],
    "linear": lambda n: [i / (n - 1) for i in range(n)],
    "reverse_linear": lambda n: [i / (n - 1) for i in reversed(range(n))],
    "zeros": lambda n: [0.0] * n,
}


def _weights(value: Any, count: int) -> list[float] | None:
    """One of kohya's down/mid/up_lr_weight values: "w0,w1,…" (empty entries are 0, a short list is
    filled with 1, a long one cut) or a curve name with an optional "+base" ("sine+0.5")."""
    if _blank(value):
        return None
    text = str(value).strip()
    name, _, base = text.partition("+")
    if name in BLOCK_CURVES and count > 1:
        return [w + (float(base) if base else 0.0) for w in BLOCK_CURVES[name](count)]
    values = [float(p) if p.strip() else 0.0 for p in text.split(",")]
    return (values + [1.0] * count)[:count]


def block_lr_from_kohya(src: dict, arch: str) -> dict[str, float]:
    """kohya's down_lr_weight / mid_lr_weight / up_lr_weight (+ block_lr_zero_threshold) -> network.block_lr
    keys: down[k] is IN<k>, up[k] is OUT<k> (input/output_blocks.k of the original UNet), mid is M00-M02
    (SDXL: one each; SD1/SD2: one for the whole middle block). Only multipliers other than 1 are kept;
    IN00 (conv_in, never adapted) is left out. ValueError for values kohya would not accept."""
    per_side, mid_count = BLOCK_COUNTS.get(arch, BLOCK_COUNTS_DEFAULT)
    threshold = 0.0 if _blank(src.get("block_lr_zero_threshold")) else _num(src["block_lr_zero_threshold"])
    down, up = _weights(src.get("down_lr_weight"), per_side), _weights(src.get("up_lr_weight"), per_side)
    mid = _weights(src.get("mid_lr_weight"), mid_count)
    if down is None and mid is None and up is None:
        return {}
    named: dict[str, float] = {}
    for prefix, values in (("IN", down), ("OUT", up)):
        named.update({f"{prefix}{k:02d}": w for k, w in enumerate(values or []) if not (prefix == "IN" and k == 0)})
    if mid is not None:
        named.update({"M*": mid[0]} if mid_count == 1 else {f"M{k:02d}": w for k, w in enumerate(mid)})
    return {k: (0.0 if w <= threshold else round(w, 6)) for k, w in named.items()
            if (0.0 if w <= threshold else w) != 1.0}
