"""Reading and writing configs: migrations, validation with errors that name the key, TOML, --set overrides."""
from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

from ..file_limits import read_text_capped

from .base import CONFIG_VERSION, ConfigError
from .schema import TrainConfig, sections

# ----------------------------------------------------------------------------- migrations

def _migrate_0_to_1(data: dict) -> dict:
    """Version 0 (unversioned early drafts) called the network rank `dim`."""
    net = data.get("network", {})
    if isinstance(net, dict) and "dim" in net and "rank" not in net:
        net["rank"] = net.pop("dim")
    return data


MIGRATIONS = {0: _migrate_0_to_1}


def migrate(data: dict) -> dict:
    """Bring a raw config dict up to CONFIG_VERSION (missing version means current)."""
    version = data.get("version", CONFIG_VERSION)
    if not isinstance(version, int) or version > CONFIG_VERSION:
        raise ConfigError(f"version: unsupported config version {version!r} (this build reads up to {CONFIG_VERSION})")
    while version < CONFIG_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
    data["version"] = CONFIG_VERSION
    return data


# ----------------------------------------------------------------------------- validation

def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_unknown_keys(data: dict) -> None:
    """Reject unknown sections and keys with a suggestion, before pydantic sees them."""
    secs = sections()
    top = ["version", *secs]
    for name, value in data.items():
        if name not in top:
            raise ConfigError(f"{name}: unknown section or key{_suggest(name, top)}")
        if name in secs:
            if not isinstance(value, dict):
                raise ConfigError(f"{name}: must be a table ([{name}]), got {value!r}")
            keys = list(secs[name].model_fields)
            for key in value:
                if key not in keys:
                    raise ConfigError(f"{name}.{key}: unknown key{_suggest(key, keys)}")


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"]
    ctx = err.get("ctx") or {}
    if err["type"] == "greater_than_equal":
        msg = f"must be ≥ {ctx['ge']}"
    elif err["type"] == "less_than_equal":
        msg = f"must be ≤ {ctx['le']}"
    elif err["type"] == "finite_number":
        msg = "must be a finite number (not nan or inf)"
    elif err["type"] == "literal_error":
        msg = f"must be one of {ctx.get('expected')}"
    elif err["type"] == "value_error":
        msg = str(ctx.get("error", msg))
    got = repr(err.get("input"))
    if len(got) > 80:  # a 5,000-character path is not echoed back whole
        got = f"{got[:50]}…{got[-10:]} ({len(got):,} characters)"
    return f"{loc}: {msg}, got {got}"


def overlay(base: dict, top: dict) -> dict:
    """`top` over `base`, one level of [sections] deep (a config's shape)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def from_dict(data: dict) -> TrainConfig:
    """Validate a (possibly sparse) dict into a complete config; errors name the key."""
    data = migrate(dict(data))
    check_unknown_keys(data)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e.errors()[0])) from None


def to_dict(cfg: TrainConfig) -> dict:
    return cfg.model_dump(mode="json")


def sparse_dict(cfg: TrainConfig) -> dict:
    """Only what differs from the defaults (for presets), plus the version."""
    full, default = to_dict(cfg), to_dict(TrainConfig())
    out: dict[str, Any] = {"version": full["version"]}
    for sec, values in full.items():
        if isinstance(values, dict):
            diff = {k: v for k, v in values.items() if v != default[sec][k]}
            if diff:
                out[sec] = diff
    return out


def strip_secrets(data: dict) -> dict:
    """A copy of a config dict without fields marked secret."""
    out = {}
    for sec, values in data.items():
        if isinstance(values, dict) and sec in sections():
            fields = sections()[sec].model_fields
            out[sec] = {k: v for k, v in values.items()
                        if not (k in fields and (fields[k].json_schema_extra or {}).get("secret"))}
        else:
            out[sec] = values
    return out


# ----------------------------------------------------------------------------- TOML and overrides

def load_toml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        return tomllib.loads(read_text_capped("config", p))  # a regular file of at most 4 MB
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None


def dumps_toml(data: dict) -> str:
    return tomli_w.dumps(strip_secrets(data))


def save_toml(data: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(dumps_toml(data), encoding="utf-8")


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value). Values are read as TOML values
    (numbers, booleans, lists, quoted strings); anything else is a plain string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    dotted, raw = text.split("=", 1)
    section, key = dotted.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, key, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for text in overrides:
        section, key, value = parse_override(text)
        if section == "version":
            raise ConfigError("version: cannot be overridden")
        data.setdefault(section, {})
        if isinstance(data[section], dict):
            data[section][key] = value
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """TOML file (sparse or complete) + `--set` overrides -> validated config."""
    data = load_toml(path) if path else {}
    return from_dict(apply_overrides(data, overrides or []))
