"""Presets: sparse TOML overlays on the schema defaults.

Built-in presets (the repo's presets/*.toml) are read-only; user presets live in one
folder (default presets/user/). Names are sanitised so a preset can never be written
outside that folder, and secrets are never written at all.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from trainer_backend.config import (ConfigError, TrainConfig, dumps_toml, from_dict, load_toml, sparse_dict,
                                    strip_secrets)
from trainer_backend.config.io import overlay  # noqa: F401  (re-exported for the pages)

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "presets"
DEFAULT_USER_DIR = BUILTIN_DIR / "user"
BUILTIN_SUFFIX = " (built-in)"
MAX_NAME = 64


class PresetError(ValueError):
    """A preset operation the user asked for cannot be done; the message says why."""


@dataclass(frozen=True)
class Preset:
    name: str
    builtin: bool
    path: Path

    @property
    def label(self) -> str:
        return self.name + (BUILTIN_SUFFIX if self.builtin else "")


def sanitize_name(name: str) -> str:
    """A preset name that is a plain file name: letters and digits of any script, . _ - and spaces;
    anything else becomes '-'. Leading dots/dashes are dropped so '..' or '.hidden' cannot be made."""
    cleaned = re.sub(r"[^\w. -]+", "-", (name or "").strip())
    cleaned = re.sub(r"-{2,}", "-", cleaned).lstrip(".- ").rstrip(". ")[:MAX_NAME].strip()
    if not cleaned:
        raise PresetError(f"preset name {name!r} has no usable characters (use letters, digits, . _ -)")
    return cleaned


def preset_text(cfg: TrainConfig, title: str = "") -> str:
    """The sparse TOML a preset file holds (secrets removed, version kept)."""
    header = f"# {title}\n" if title else ""
    return header + dumps_toml(strip_secrets(sparse_dict(cfg)))


class PresetStore:
    def __init__(self, user_dir: str | Path = DEFAULT_USER_DIR, builtin_dir: str | Path = BUILTIN_DIR):
        self.user_dir = Path(user_dir)
        self.builtin_dir = Path(builtin_dir)

    # ------------------------------------------------------------------ listing
    def _scan(self, folder: Path, builtin: bool) -> list[Preset]:
        if not folder.is_dir():
            return []
        return [Preset(p.stem, builtin, p) for p in sorted(folder.glob("*.toml"), key=lambda p: p.stem.lower())]

    def list(self) -> list[Preset]:
        """Built-ins first, then user presets."""
        return self._scan(self.builtin_dir, True) + self._scan(self.user_dir, False)

    def labels(self) -> list[str]:
        return [p.label for p in self.list()]

    def find(self, label: str) -> Preset:
        for p in self.list():
            if label in (p.label, p.name) and (p.builtin or not label.endswith(BUILTIN_SUFFIX)):
                return p
        raise PresetError(f"no preset named {label!r}")

    # ------------------------------------------------------------------ reading
    def load(self, label: str, base: dict | None = None) -> TrainConfig:
        """Read, migrate and validate a preset onto the defaults (and `base`, sparse values
        the studio sets under every preset, e.g. output.dir = --runs-dir)."""
        preset = self.find(label)
        data = load_toml(preset.path)
        try:
            return from_dict(overlay(base or {}, data))
        except ConfigError as e:
            raise PresetError(f"preset {preset.label}: {e}") from None

    # ------------------------------------------------------------------ writing
    def user_path(self, name: str) -> Path:
        """The file for a user preset; never outside user_dir whatever the name."""
        safe = sanitize_name(name)
        root = self.user_dir.resolve()
        path = (root / f"{safe}.toml").resolve()
        if path.parent != root:
            raise PresetError(f"preset name {name!r} would leave the presets folder")
        return path

    def save(self, name: str, cfg: TrainConfig, overwrite: bool = True) -> Preset:
        """Write a user preset (sparse, no secrets). Built-in names are refused."""
        safe = sanitize_name(name)
        if any(p.builtin and p.name.lower() == safe.lower() for p in self.list()):
            raise PresetError(f"{safe!r} is a built-in preset (read-only); save under another name")
        path = self.user_path(safe)
        if path.exists() and not overwrite:
            raise PresetError(f"a preset named {safe!r} already exists")
        self.user_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".toml.tmp")
        tmp.write_text(preset_text(cfg, f"SD Training Studio preset '{safe}'"), encoding="utf-8")
        tmp.replace(path)
        return Preset(safe, False, path)

    def delete(self, label: str) -> Preset:
        preset = self.find(label)
        if preset.builtin:
            raise PresetError(f"{preset.label} is read-only and cannot be deleted")
        preset.path.unlink()
        return preset


TIER = re.compile(r"^(?P<base>.+)-(?P<gb>\d+)gb$", re.IGNORECASE)


def tier_for_card(names: list[str], name: str, card_gb: float) -> str:
    """Tiered presets are siblings named <base>-<N>gb (sdxl-lora-8gb … sdxl-lora-24gb), each planned to
    fit an N GB card (docs/memory.md). For `name`, the sibling for a card of `card_gb`: the largest tier
    that is not above the card (the smallest tier when the card is smaller than every one). `name`
    itself when it has no tier, no sibling, or the card is unknown (0)."""
    m = TIER.match(name)
    if not m or card_gb <= 0:
        return name
    tiers = {int(t.group("gb")): n for n in names if (t := TIER.match(n)) and t.group("base") == m.group("base")}
    fitting = [gb for gb in tiers if gb <= card_gb + 0.5]   # a "24 GB" card reports 23.6 GiB
    return tiers[max(fitting)] if fitting else tiers[min(tiers)]

