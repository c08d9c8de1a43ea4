"""The training form, derived from the schema: one widget per field, no field wired by hand.

This module holds the gradio-free half: which fields exist, in which tab, and how a
widget's value converts to and from a config value. `gui/widgets.py` builds the widgets.
"""
from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field
from typing import Any

import tomllib

import tomli_w
from pydantic import BaseModel

from trainer_backend.config import ConfigError, TrainConfig, all_fields, from_dict, sections, to_dict


@dataclass(frozen=True)
class FormField:
    """One schema field as the form sees it (a thin view over `all_fields()`)."""
    section: str
    key: str
    type: str                       # bool|int|float|str|choice|list
    default: Any
    help: str
    tab: str
    choices: tuple = ()
    bounds: dict = field(default_factory=dict)
    widget: str = ""
    advanced: bool = False
    secret: bool = False
    list_of_strings: bool = False   # list[str] is edited as comma-separated text
    item_keys: tuple = ()           # list of tables: the keys one table may hold (for the help text)
    when: dict = field(default_factory=dict)  # where the option applies (the schema's `when`)

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def elem_id(self) -> str:
        return f"field-{self.section}-{self.key}"

    def info(self) -> str:
        """Help text plus the bounds the schema enforces, shown under the widget."""
        parts = []
        for bound, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("multiple_of", "multiple of")):
            if bound in self.bounds:
                parts.append(f"{sign} {self.bounds[bound]}")
        text = self.help
        if parts:
            text += f" ({', '.join(parts)})"
        if self.list_of_strings:
            text += " Comma-separated."
        elif self.item_keys:
            text += f" TOML, [[{self.key}]] tables; keys: {', '.join(self.item_keys)}."
        elif self.edited_as_toml:
            text += " TOML."
        return text

    @property
    def edited_as_toml(self) -> bool:
        """Lists of tables, tables and lists of numbers are edited as TOML text."""
        return self.type == "list" and not self.list_of_strings


def _list_item(section: str, key: str) -> Any:
    """The item type of a list field (str, a Section model, ...), or None."""
    annotation = sections()[section].model_fields[key].annotation
    args = typing.get_args(annotation)
    return args[0] if typing.get_origin(annotation) is list and len(args) == 1 else None


def form_fields() -> list[FormField]:
    """Every schema field, in schema order."""
    out = []
    for meta in all_fields():
        bounds = {b: meta[b] for b in ("ge", "gt", "le", "lt", "multiple_of", "pattern", "min_length") if b in meta}
        ui = meta.get("ui") or {}
        item = _list_item(meta["section"], meta["key"])
        out.append(FormField(
            section=meta["section"], key=meta["key"], type=meta["type"], default=meta["default"],
            help=meta.get("help", ""), tab=meta.get("tab") or "Other", choices=tuple(meta.get("choices") or ()),
            bounds=bounds, widget=ui.get("widget", ""), advanced=bool(ui.get("advanced")),
            secret=bool(meta.get("secret")),
            list_of_strings=meta["type"] == "list" and item is str,
            item_keys=tuple(item.model_fields) if isinstance(item, type) and issubclass(item, BaseModel) else (),
            when=dict(meta.get("when") or {})))
    return out


ACRONYMS = {"lr": "LR", "ema": "EMA", "vae": "VAE", "cfg": "CFG", "snr": "SNR", "gpu": "GPU", "ids": "IDs",
            "te": "text encoder", "url": "URL", "ip": "IP", "mb": "(MB)", "s3": "S3", "ddp": "DDP", "fsdp": "FSDP",
            "kl": "KL", "bf16": "bf16", "fp16": "fp16", "n": "N", "s": "(seconds)", "p": "probability", "dir": "folder",
            "abs": "absolute", "num": "number of", "max": "max", "min": "min", "cpu": "CPU", "wandb": "W&B",
            "clip": "CLIP", "t5": "T5", "t5xxl": "T5-XXL", "l": "L", "g": "G", "qwen": "Qwen", "nf4": "NF4",
            "lora": "LoRA", "dora": "DoRA", "toml": "TOML", "json": "JSON", "id": "ID", "hf": "HF", "vlm": "VLM"}


def human_label(f: FormField) -> str:
    """'Max grad norm · max_grad_norm': words for people next to the TOML key they type."""
    words = [ACRONYMS.get(w, w) for w in f.key.split("_")]
    text = " ".join(words).strip()
    return f"{text[:1].upper()}{text[1:]} · {f.key}"


def section_heading(section: str) -> str:
    """A section's docstring up to its first blank line, as one line (however it was wrapped)."""
    doc = (sections()[section].__doc__ or "").strip()
    return " ".join(line.strip() for line in doc.split("\n\n", 1)[0].splitlines())


def tabs_in_order(fields: list[FormField]) -> list[str]:
    """Tab names in the order their first section appears in the schema."""
    seen: list[str] = []
    for f in fields:
        if f.tab not in seen:
            seen.append(f.tab)
    return seen


# ----------------------------------------------------------------------------- value conversion

def to_widget_value(f: FormField, value: Any) -> Any:
    """Config value -> what the widget shows."""
    if f.list_of_strings:
        return ", ".join(str(v) for v in value or [])
    if f.edited_as_toml:
        if not value:
            return ""
        if isinstance(value, dict):
            return tomli_w.dumps(value)
        if all(isinstance(v, dict) for v in value):
            return tomli_w.dumps({f.key: value})
        return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()
    return value


def from_widget_value(f: FormField, raw: Any) -> Any:
    """Widget value -> config value. Raises ConfigError naming the field when it cannot convert;
    range checks are left to the schema so messages stay in one style."""
    if f.list_of_strings:
        text = str(raw or "").strip()
        return [part.strip() for part in text.replace("\n", ",").split(",") if part.strip()]
    if f.edited_as_toml:
        return _parse_toml_value(f, str(raw or "").strip())
    if f.type in ("int", "float"):
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            raise ConfigError(f"{f.dotted}: a number is required")
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{f.dotted}: not a number, got {raw!r}") from None
        if f.type == "int":
            if not math.isfinite(number) or number != int(number):
                raise ConfigError(f"{f.dotted}: must be a whole number, got {raw!r}")
            return int(number)
        return number
    if f.type == "bool":
        return bool(raw)
    return "" if raw is None else raw


def _parse_toml_value(f: FormField, text: str) -> Any:
    """TOML text -> a table (`k = v` lines), a list of tables (`[[key]]` blocks) or a list."""
    if not text:
        return type(f.default)() if isinstance(f.default, (list, dict)) else []
    try:
        if isinstance(f.default, dict):
            return tomllib.loads(text)
        if text.startswith("["):
            try:
                return tomllib.loads(f"v = {text}")["v"]
            except tomllib.TOMLDecodeError:
                pass  # `[[key]]` blocks also start with "["
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{f.dotted}: not valid TOML ({e})") from None
    if set(parsed) != {f.key}:
        raise ConfigError(f"{f.dotted}: expected [[{f.key}]] tables, got {', '.join(parsed) or 'nothing'}")
    return parsed[f.key]


def values_to_dict(fields: list[FormField], values: list[Any]) -> dict:
    """Widget values (in `fields` order) -> a complete nested config dict (secrets included)."""
    data: dict[str, Any] = {}
    for f, raw in zip(fields, values, strict=True):
        data.setdefault(f.section, {})[f.key] = from_widget_value(f, raw)
    return data


def dict_to_values(fields: list[FormField], data: dict) -> list[Any]:
    """A complete config dict -> widget values in `fields` order."""
    return [to_widget_value(f, data[f.section][f.key]) for f in fields]


def config_to_values(fields: list[FormField], cfg: TrainConfig) -> list[Any]:
    return dict_to_values(fields, to_dict(cfg))


def error_field(fields: list[FormField], error: ConfigError | str) -> FormField | None:
    """The field a ConfigError names: the longest dotted key its message starts with."""
    head = str(error).split(":", 1)[0].strip()
    best = None
    for f in fields:
        if head == f.dotted or head.startswith(f.dotted + "."):
            if best is None or len(f.dotted) > len(best.dotted):
                best = f
    return best


def field_visibility(fields: list[FormField], values: list[Any]) -> list[bool]:
    """Per field: does it apply to the form's current values (the schema's `when` conditions)? With
    model.arch = "auto" the family the model given names decides (a builtin name, a folder's pipeline:
    trainer_backend/launch/model_size.py), so a tiny SD1 model shows no Flux or SD3 file fields."""
    from trainer_backend.config.applicability import applies
    from trainer_backend.launch.model_size import arch_of
    current: dict[str, Any] = {}
    for f, raw in zip(fields, values, strict=True):
        try:
            current[f.dotted] = from_widget_value(f, raw)
        except ConfigError:
            current[f.dotted] = raw
    if current.get("model.arch") == "auto":
        current["model.arch"] = arch_of("auto", str(current.get("model.path") or ""))
    return [applies(f.when, current) for f in fields]


def form_problems(fields: list[FormField], values: list[Any]) -> tuple[TrainConfig | None, list[ConfigError]]:
    """Form values -> (config, []) or (config or None, every problem): a value the schema refuses, else
    every problem `run_problems` finds (trainer_backend/config/checks.py: the files, the cross-field rules,
    the methods' own), each naming its key: the same function Start, `validate` and the trainer call."""
    from trainer_backend.config.checks import run_problems
    cfg, error = validate_values(fields, values)
    if error is not None:
        return None, [error]
    return cfg, [problem.error() for problem in run_problems(cfg.model_copy(deep=True))]


def validate_values(fields: list[FormField], values: list[Any]) -> tuple[TrainConfig | None, ConfigError | None]:
    """Form values -> (config, None) or (None, the first error, naming its key)."""
    try:
        return from_dict(values_to_dict(fields, values)), None
    except ConfigError as e:
        return None, e
