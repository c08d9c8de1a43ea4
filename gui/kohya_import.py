"""Import a kohya_ss GUI config/preset (JSON) as a studio preset.

Every kohya key we can express is mapped; the report lists what was mapped, what was
approximated and why, and every key we do not support that is actually set. Keys whose
target is not (yet) in the schema are reported as unsupported rather than guessed.
Secrets a kohya file may hold (W&B key, Hugging Face token) are never imported.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from trainer_backend.config import ConfigError, TrainConfig, from_dict
from trainer_backend.config.memory_rules import FUSED_OPTIMIZERS

from trainer_backend.file_limits import path_text_problem

from gui.kohya_input import (BAD_VALUE, VALUE_LIMIT, ImportProblem, convert_warmup, parse_kohya_text,  # noqa: F401
                             planned_steps, read_kohya_file, shown)
from gui.kohya_family import chosen_family
from gui.kohya_keys import (APPROX_OPTIMIZERS, COMPONENT_FILES, DIRECT, FAMILY_KEYS, KOHYA_DEFAULTS, LOCON_TYPES,
                            NETWORK_TYPES, OPTIMIZERS, SAMPLERS, SECRET_KEYS, SPECIAL, TIMESTEP_SAMPLING,
                            WEIGHTING_SCHEME, _blank, _int, _num, _off, _truthy, block_lr_from_kohya)
from gui.schema_form import form_fields


@dataclass
class KohyaImport:
    data: dict = field(default_factory=dict)                          # sparse studio config
    mapped: list[tuple[str, str, Any]] = field(default_factory=list)  # kohya key, studio key, value
    notes: list[str] = field(default_factory=list)                    # approximations, in words
    unsupported: list[tuple[str, Any]] = field(default_factory=list)  # set in the file, not expressible
    unset: list[str] = field(default_factory=list)                    # unsupported but off/empty: harmless
    defaults: list[tuple[str, Any, str]] = field(default_factory=list)  # kohya key, value, why it is ours anyway
    ignored: list[tuple[str, Any, str]] = field(default_factory=list)   # kohya key, value, why (the chosen family)
    warmup_percent: float | None = None   # lr_warmup in % of a step count the file does not give (see below)

    def config(self) -> TrainConfig:
        return from_dict(self.data)


def _flow_family(src: dict, b: "_Builder", chosen: str = "") -> None:
    """SD3 and Flux presets (or a flow family chosen in the studio): the family, and kohya's timestep
    sampling and weighting scheme."""
    key = next((k for k in FAMILY_KEYS if _truthy(src.get(k))), None)
    if chosen:
        from trainer_backend.families.registry import entry
        if entry(chosen).objective != "flow":
            return
    elif key is None:
        return
    else:
        b.put(key, "model.arch", FAMILY_KEYS[key])
    sampling = str(src.get("timestep_sampling", "")).strip()
    if sampling in TIMESTEP_SAMPLING:
        density, shift = TIMESTEP_SAMPLING[sampling]
        b.put("timestep_sampling", "loss.timestep_sampling", density)
        if shift is not None:
            b.put("timestep_sampling", "loss.flow_shift", shift)
    elif sampling:
        b.result.unsupported.append(("timestep_sampling", sampling))
    scheme = str(src.get("weighting_scheme", "")).strip()
    if scheme in WEIGHTING_SCHEME:
        b.put("weighting_scheme", *WEIGHTING_SCHEME[scheme])
    elif scheme:
        b.result.unsupported.append(("weighting_scheme", scheme))
    if str(src.get("model_prediction_type", "raw")).strip() not in ("raw", ""):
        b.result.unsupported.append(("model_prediction_type", src["model_prediction_type"]))
    # ComfyUI-style component files beside a single-file model.path (docs/models.md)
    for kohya_key, dotted in COMPONENT_FILES.items():
        if not _blank(src.get(kohya_key)):
            b.put(kohya_key, dotted, str(src[kohya_key]).strip())


class _Builder:
    def __init__(self) -> None:
        self.result = KohyaImport()
        self.known = {f.dotted for f in form_fields()}
        self.paths = {f.dotted for f in form_fields() if f.widget == "path"}
        self.adaptive = False   # the optimizer sets its own step size (lr 1.0)

    def put(self, kohya_key: str, dotted: str, value: Any) -> None:
        if dotted not in self.known:
            self.result.unsupported.append((kohya_key, value))
            return
        if dotted in self.paths and isinstance(value, str):
            problem = path_text_problem(value)
            if problem:
                self.result.unsupported.append((kohya_key, f"the path {problem}"))
                return
            if ".." in value.replace("\\", "/").split("/"):
                self.note(f"`{kohya_key}` = {shown(value)} climbs out of its folder (`..`): check where it points "
                          "before you start")
        section, key = dotted.split(".", 1)
        self.result.data.setdefault(section, {})[key] = value
        self.result.mapped = [m for m in self.result.mapped if m[1] != dotted] + [(kohya_key, dotted, value)]

    def note(self, text: str) -> None:
        self.result.notes.append(text)

    def convert(self, kohya_key: str, dotted: str, convert, value: Any) -> bool:
        """put(convert(value)); a value the converter refuses ("inf", "1e400", text) becomes a report line."""
        try:
            converted = convert(value)
        except BAD_VALUE as e:
            self.result.unsupported.append((kohya_key, f"{shown(value)} is not usable here ({e})"))
            return False
        self.put(kohya_key, dotted, converted)
        return True


def _special_cases(src: dict, b: _Builder) -> None:
    # kohya's LoRA/DreamBooth tabs save `sdxl`, its Finetune tab `sdxl_checkbox`
    sdxl_key = next((k for k in ("sdxl", "sdxl_checkbox") if _truthy(src.get(k))), None)
    arch = "sdxl" if sdxl_key else "sd2" if _truthy(src.get("v2")) else "sd1"
    if any(k in src for k in ("sdxl", "sdxl_checkbox", "v2")):
        b.put(sdxl_key or ("v2" if arch == "sd2" else "sdxl/v2"), "model.arch", arch)
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
                if b.convert("conv_dim", "network.conv_rank", _int, src["conv_dim"]) and not _off(src.get("conv_alpha")):
                    b.convert("conv_alpha", "network.conv_alpha", _num, src["conv_alpha"])
            else:
                b.note(f"LoRA_type {lora_type!r} without conv_dim: imported as plain LoRA")
        else:
            b.result.unsupported.append(("LoRA_type", lora_type))
    elif "network_dim" not in src:
        b.put("(no LoRA_type)", "network.type", "full")
        b.note("no LoRA settings in the file: imported as a full fine-tune (kohya's DreamBooth/Finetune tab)")

    _optimizer(src, b)

    if src.get("dora_wd"):
        b.put("dora_wd", "network.dora", True)
    sampler = str(src.get("sample_sampler", "")).strip().lower()
    if sampler:
        if sampler in SAMPLERS:
            b.put("sample_sampler", "samples.scheduler", SAMPLERS[sampler])
        else:
            b.result.unsupported.append(("sample_sampler", src["sample_sampler"]))

    scheduler = str(src.get("lr_scheduler", "")).strip()
    if scheduler.lower() == "adafactor" and b.adaptive:   # Adafactor's own relative-step schedule
        b.put("lr_scheduler", "optimizer.scheduler", "constant")
    elif scheduler:
        choices = next(f.choices for f in form_fields() if f.dotted == "optimizer.scheduler")
        if scheduler in choices:
            b.put("lr_scheduler", "optimizer.scheduler", scheduler)
        else:
            b.result.unsupported.append(("lr_scheduler", scheduler))

    if not _off(src.get("max_train_epochs")):
        b.convert("max_train_epochs", "schedule.epochs", _int, src["max_train_epochs"])
    if b.adaptive:
        pass  # the adaptive optimizer's lr (1.0) was set by _optimizer
    elif not _off(src.get("unet_lr")) and "network_dim" in src:
        b.convert("unet_lr", "optimizer.lr", _num, src["unet_lr"])
    te_lr = src.get("text_encoder_lr", src.get("learning_rate_te"))
    te_key = "text_encoder_lr" if "text_encoder_lr" in src else "learning_rate_te"
    if not _off(te_lr):
        b.convert(te_key, "network.text_encoder_lr", _num, te_lr)
    if "network_dim" in src:
        train_te = not src.get("network_train_unet_only", False) and not _off(te_lr)
        b.put("network_train_unet_only/text_encoder_lr", "network.train_text_encoder", train_te)

    warmup = src.get("lr_warmup")
    if not _off(warmup) and _off(src.get("lr_warmup_steps")):
        try:
            percent = _num(warmup)
            if not 0 <= percent <= 100:
                raise ValueError("a percentage is 0 to 100")
            steps = None if _off(src.get("max_train_steps")) else _int(src["max_train_steps"])
        except BAD_VALUE as e:
            b.result.unsupported.append(("lr_warmup", f"{shown(warmup)} is not usable here ({e})"))
        else:
            if steps:
                b.put("lr_warmup", "optimizer.warmup_steps", int(round(percent / 100 * steps)))
                b.note(f"lr_warmup {percent:g}% of max_train_steps converted to optimizer.warmup_steps")
            else:  # a share of the step plan's count: convert_warmup, once the plan knows it
                b.result.warmup_percent = percent

    attention = str(src.get("xformers", "")).strip().lower()
    if attention in ("xformers", "sdpa"):
        b.put("xformers", "precision.attention", "sdpa")
        if attention == "xformers":
            b.note("xformers attention imported as PyTorch SDPA (same memory class, no extra package)")
    elif attention == "none":
        b.put("xformers", "precision.attention", "default")

    if not _off(src.get("noise_offset")) and str(src.get("noise_offset_type", "Original")) != "Original":
        b.result.unsupported.append(("noise_offset_type", src["noise_offset_type"]))
    _kohya_extras(src, b, arch)


def _kohya_extras(src: dict, b: _Builder, arch: str) -> None:
    """clip_skip, masks and block-wise learning rates (network_weights and masked_loss are DIRECT)."""
    from trainer_backend.families.registry import entry
    family = next((f for k, f in FAMILY_KEYS.items() if _truthy(src.get(k))), arch)
    if not _off(src.get("clip_skip")):
        try:
            skip = _int(src["clip_skip"])
        except ValueError:
            b.result.unsupported.append(("clip_skip", src["clip_skip"]))
        else:
            if entry(family).clip_skip:
                b.put("clip_skip", "model.clip_skip", skip)
            elif skip > 1:
                b.note(f"clip_skip {skip} not imported: {family} is not conditioned on one CLIP encoder's last "
                       f"layer (kohya's sd-scripts ignore clip_skip for SDXL too)")
    if _truthy(src.get("alpha_mask")):
        b.put("alpha_mask", "loss.masked", True)
    if not _blank(src.get("conditioning_data_dir")):
        if _truthy(src.get("masked_loss")):
            b.put("conditioning_data_dir", "dataset.mask_path", str(src["conditioning_data_dir"]))
        else:   # without masked_loss kohya's conditioning images are ControlNet inputs, not masks
            b.result.unsupported.append(("conditioning_data_dir", src["conditioning_data_dir"]))
    keys = ("down_lr_weight", "mid_lr_weight", "up_lr_weight")
    if any(not _blank(src.get(k)) for k in keys):
        try:
            block_lr = block_lr_from_kohya(src, family)
        except ValueError:
            b.result.unsupported.extend((k, src[k]) for k in keys if not _blank(src.get(k)))
            return
        b.put("/".join(k for k in keys if not _blank(src.get(k))), "network.block_lr", block_lr)
        if any(v == 0 for v in block_lr.values()):
            b.note("block learning rates of 0: kohya creates no adapter there; the studio creates it and keeps "
                   "it frozen at zero (the same effect; network.exclude_modules leaves layers out entirely)")


def _optimizer(src: dict, b: _Builder) -> None:
    """kohya's optimizer and its free-text arguments. Optimizers that set their own step size
    (D-Adaptation, relative-step Adafactor) run with lr = 1.0 in kohya: imported as a fixed-LR
    optimizer that would diverge, so they become Prodigy (adaptive too) with lr 1.0."""
    args = _parse_optimizer_args(src.get("optimizer_args", ""))
    name = str(src.get("optimizer") or "").strip()
    low = name.lower()
    relative = low == "adafactor" and (str(args.get("relative_step", "")).lower() == "true"
                                       or str(src.get("lr_scheduler", "")).strip().lower() == "adafactor")
    if low.startswith("dadapt") or relative:
        b.adaptive = True
        b.put("optimizer", "optimizer.name", "prodigy")
        b.put("optimizer", "optimizer.lr", 1.0)
        why = ("relative-step Adafactor (lr_scheduler = adafactor / relative_step=True)" if relative
               else f"{name} (D-Adaptation)")
        b.note(f"optimizer {why} sets its own learning rate; the studio's {'Adafactor' if relative else 'D-Adaptation'}"
               " has no such mode, so it was imported as Prodigy (also adaptive; lr 1.0; needs "
               "the prodigyopt package)" + (". Prodigy keeps two moments per weight: a full fine-tune needs more "
                                            "memory than with Adafactor" if relative else ""))
        for key in ("relative_step", "scale_parameter", "warmup_init", "decouple", "use_bias_correction"):
            args.pop(key, None)
    elif low in OPTIMIZERS:
        b.put("optimizer", "optimizer.name", OPTIMIZERS[low])
    elif low in APPROX_OPTIMIZERS:
        b.put("optimizer", "optimizer.name", APPROX_OPTIMIZERS[low])
        b.note(f"optimizer {name!r} imported as {APPROX_OPTIMIZERS[low]!r}")
    elif name:
        b.result.unsupported.append(("optimizer", src["optimizer"]))
    if low == "adafactor" and not relative:
        for key in ("relative_step", "scale_parameter", "warmup_init"):   # False: what ours does anyway
            if str(args.get(key, "false")).lower() == "false":
                args.pop(key, None)
    _optimizer_args(args, b)


def _parse_optimizer_args(text: Any) -> dict[str, str]:
    """`weight_decay=0.1 betas=0.9,0.99` or `"weight_decay=0.1" "betas=(0.9, 0.99)"` -> {key: value}."""
    text = str(text or "").strip()
    try:
        tokens = shlex.split(text)
    except ValueError:
        tokens = text.replace('"', " ").replace("'", " ").split()
    merged: list[str] = []
    for token in tokens:   # `betas=0.9, 0.99`: a value split at the space after a comma
        if merged and "=" not in token and merged[-1].endswith(","):
            merged[-1] += token
        elif token:
            merged.append(token)
    out = {}
    for token in merged:
        key, sep, value = token.partition("=")
        out[key.strip()] = value.strip().strip("()[]") if sep else "True"
    return out


def _optimizer_args(args: dict[str, str], b: _Builder) -> None:
    """Parsed optimizer arguments -> our optimizer fields; the rest is reported."""
    for key, value in args.items():
        try:
            if key == "weight_decay":
                b.put("optimizer_args weight_decay", "optimizer.weight_decay", _num(value))
            elif key == "betas":
                beta1, beta2 = (_num(v) for v in value.split(","))
                b.put("optimizer_args betas", "optimizer.beta1", beta1)
                b.put("optimizer_args betas", "optimizer.beta2", beta2)
            elif key == "eps":
                b.put("optimizer_args eps", "optimizer.eps", _num(value))
            elif key == "fused" and b.result.data.get("optimizer", {}).get("name", "adamw") in FUSED_OPTIMIZERS:
                # torch's fused AdamW/SGD kernel (kohya passes the argument to the torch optimizer)
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                b.put("optimizer_args fused", "optimizer.fused", value.lower() == "true")
            else:
                b.result.unsupported.append((f"optimizer_args {key}", value))
        except ValueError:
            b.result.unsupported.append((f"optimizer_args {key}", value))


def import_kohya(source: str | dict, family: str = "") -> KohyaImport:
    """A kohya_ss JSON config (text or parsed) -> sparse studio config plus a report.
    The returned `data` always validates: values the schema rejects are moved to `unsupported`.
    `family`: a model.arch chosen in the studio (the families kohya_ss has no key for: Krea 2, Qwen-Image 2.1,
    Ideogram 4, ...); it wins over the file's sdxl/v2/sd3/flux keys, and the keys meaningless for it are
    reported in `ignored` with the reason; "" = the family the file's keys say."""
    if isinstance(source, str):
        source = parse_kohya_text(source)
    if not isinstance(source, dict):
        raise ImportProblem("not a kohya_ss JSON config: expected an object of settings")
    b = _Builder()
    for key, value in source.items():
        if isinstance(value, (dict, list)):
            b.result.unsupported.append((key, "a nested value (kohya's settings are single values): not imported"))
            continue
        if isinstance(value, str) and len(value) > VALUE_LIMIT:
            b.result.unsupported.append((key, f"a text of {len(value):,} characters (at most {VALUE_LIMIT:,}): "
                                              "not imported"))
            continue
        if key in SECRET_KEYS:
            if not _blank(value):
                b.note(f"{key} is a secret and was not imported (set it in the environment or the GUI)")
            continue
        if key in DIRECT:
            dotted, convert = DIRECT[key]
            # 0 is a real setting where the studio's default is not 0 (max_grad_norm = 0: no clipping)
            if _blank(value) or (_off(value) and convert is not bool and dotted != "dataset.center_crop"
                                 and key not in ("seed", "max_grad_norm")):
                continue
            b.convert(key, dotted, convert, value)
        elif key in KOHYA_DEFAULTS and str(value).strip().lower() in KOHYA_DEFAULTS[key]:
            b.result.defaults.append((key, value, KOHYA_DEFAULTS[key][str(value).strip().lower()]))
        elif key not in SPECIAL:
            if _off(value):
                b.result.unset.append(key)
            else:
                b.result.unsupported.append((key, value))
    _special_cases(source, b)
    _flow_family(source, b, family)
    if family:
        chosen_family(source, b, family)
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
    lines += [f"- `{k}` → `{d}` = `{shown(v)}`" for k, d, v in result.mapped]
    if result.defaults:
        lines += ["", f"**Mapped (default) ({len(result.defaults)}: what the studio does anyway)**", ""]
        lines += [f"- `{k}` = `{shown(v)}`: {why}" for k, v, why in result.defaults]
    if result.notes:
        lines += ["", "**Approximations and notes**", ""] + [f"- {n}" for n in result.notes]
    if result.ignored:
        lines += ["", f"**Ignored for the chosen family ({len(result.ignored)}, set in the file, meaningless there)**", ""]
        lines += [f"- `{k}` = `{shown(v)}`: {why}" for k, v, why in result.ignored]
    if result.unsupported:
        lines += ["", f"**Not supported ({len(result.unsupported)}, set in the file, not imported)**", ""]
        lines += [f"- `{shown(k)[1:-1] if isinstance(k, str) else k}` = `{shown(v, 300)}`"
                  for k, v in result.unsupported]
    if result.unset:
        lines += ["", f"Also not supported but off/empty in the file ({len(result.unset)}): "
                  + ", ".join(f"`{k}`" for k in result.unset)]
    return "\n".join(lines)
