"""`builtin:tiny-<family>` model paths: each registered family's tiny random model, built on first
use into a cache folder (never downloaded), and the race-safe folder building they share."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from .registry import BUILTIN_TINY

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = {name: family for name, (family, _) in BUILTIN_TINY.items()}
# Bump when a factory's output changes, so stale caches are rebuilt rather than reused.
TINY_MODEL_VERSION = 2  # 2: tiny-ltx2's audio VAE compresses 4x (LTX2Pipeline's audio packing)


def atomic_dir(final: Path, build: Callable[[Path], object], done_marker: str) -> Path:
    """Create `final` by building into a sibling temp dir and renaming it into place.

    Safe when several processes race: the first rename wins and the others reuse its result.
    """
    if (final / done_marker).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-building-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)  # atomic on one filesystem; fails if another process won
        except OSError:
            if not (final / done_marker).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def cache_root() -> Path:
    """Where builtin models are built: $SD_STUDIO_CACHE/models, else ~/.cache/sd-studio/models."""
    base = os.environ.get("SD_STUDIO_CACHE", "")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "sd-studio") / "models"


def _build_builtin(name: str) -> Path:
    """Build once into the cache; concurrent builders race safely (build aside, then rename)."""
    from .registry import get_family
    final = cache_root() / f"{name}-v{TINY_MODEL_VERSION}"
    arch, variant = BUILTIN_TINY[name]
    options = {"variant": variant} if variant else {}
    return atomic_dir(final, lambda tmp: get_family(arch).build_tiny(tmp, seed=0, **options), "model_index.json")


def resolve_model_path(path: str) -> Path:
    """`builtin:tiny-<family>` -> the cached folder (built on first use); else the path."""
    text = str(path).strip()
    if text.startswith(BUILTIN_PREFIX):
        name = text[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_MODELS:
            choices = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
            raise ConfigError(f"model.path: unknown builtin model {text!r} (choose {choices})")
        return _build_builtin(name)
    return Path(text).expanduser()
