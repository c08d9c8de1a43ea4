"""Single-file checkpoints: export (diffusers -> original layout), inspection, and configs.

An exported file is an ordinary original-layout `.safetensors` (A1111, ComfyUI and diffusers'
`from_single_file` load it). Its metadata also carries the small config files of the model it
came from (`sd_studio.arch`, `sd_studio.config`), so this project reloads it offline and
exactly, tokenizer included, even for tiny or custom-sized models whose shapes match no
bundled config.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ...config import ConfigError

if TYPE_CHECKING:
    from .loader import LoadedModel

META_ARCH = "sd_studio.arch"
META_CONFIG = "sd_studio.config"
SINGLE_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth")
# Only plain config/tokenizer files may be materialized from a checkpoint's metadata.
_SAFE_CONFIG_PATH = re.compile(r"^(?:[A-Za-z0-9_]+/)?[A-Za-z0-9_][A-Za-z0-9_.\-]*\.(?:json|txt)$")


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


# ----------------------------------------------------------------------------- reading

def read_keys_and_metadata(path: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Weight names -> shapes, and the file's metadata, without loading the weights."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        try:
            with safe_open(str(path), framework="pt") as f:
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
                return shapes, dict(f.metadata() or {})
        except Exception as e:  # safetensors raises several types for a corrupt header
            raise ConfigError(f"model.path: {path} is not a readable .safetensors file ({e})") from None
    import torch
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise ConfigError(f"model.path: {path} is not a readable checkpoint ({e})") from None
    state = state.get("state_dict", state) if isinstance(state, dict) else {}
    return {k: tuple(v.shape) for k, v in state.items() if hasattr(v, "shape")}, {}


def detect_arch_from_keys(shapes: dict[str, tuple[int, ...]]) -> str | None:
    """sd1 | sd2 | sdxl from original-layout key names, or None if it is none of them."""
    if any(k.startswith("conditioner.embedders.1.model.") for k in shapes) and \
            any(k.startswith("conditioner.embedders.0.transformer.") for k in shapes):
        return "sdxl"
    if any(k.startswith("cond_stage_model.model.") for k in shapes):
        return "sd2"
    if any(k.startswith("cond_stage_model.transformer.") for k in shapes):
        return "sd1"
    # No text encoder in the file (a UNet-only export): tell by the cross-attention width.
    to_k = shapes.get("model.diffusion_model.input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight")
    if to_k is not None:
        return {768: "sd1", 1024: "sd2", 2048: "sdxl"}.get(to_k[-1])
    return None


def materialize_embedded_config(metadata: dict[str, str], cache: Path) -> Path | None:
    """Write the config files embedded by `export_single_file` to a cache folder; None if absent."""
    raw = metadata.get(META_CONFIG)
    if not raw:
        return None
    try:
        files = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(files, dict) or "model_index.json" not in files or not all(
            isinstance(k, str) and _SAFE_CONFIG_PATH.match(k) and isinstance(v, str) for k, v in files.items()):
        return None
    digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:20]

    def build(tmp: Path) -> None:
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text, encoding="utf-8")

    return atomic_dir(cache / digest, build, "model_index.json")


# ----------------------------------------------------------------------------- writing

def collect_config_files(model: "LoadedModel") -> dict[str, str]:
    """The pipeline's small files (model_index, component configs, tokenizers) as {path: text}."""
    from .loader import build_pipeline
    pipe = build_pipeline(model, scheduler="default")
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        pipe.save_config(tmp)  # model_index.json only
        model.unet.save_config(tmp / "unet")
        model.vae.save_config(tmp / "vae")
        pipe.scheduler.save_config(tmp / "scheduler")
        for i, (te, tok) in enumerate(zip(model.text_encoders, model.tokenizers)):
            suffix = "" if i == 0 else f"_{i + 1}"
            te.config.save_pretrained(tmp / f"text_encoder{suffix}")
            tok.save_pretrained(tmp / f"tokenizer{suffix}")
        for p in sorted(tmp.rglob("*")):
            rel = p.relative_to(tmp).as_posix()
            if p.is_file() and _SAFE_CONFIG_PATH.match(rel):
                files[rel] = p.read_text(encoding="utf-8")
    return files


def export_single_file(model: "LoadedModel", out_file: str | Path, dtype=None,
                       extra_metadata: dict[str, str] | None = None) -> Path:
    """Write `model` (UNet, VAE, text encoders) as one original-layout `.safetensors` file.

    dtype: e.g. torch.float16 to halve the size (default: keep the weights' dtype).
    """
    from safetensors.torch import save_file
    from .ldm_keys import pipeline_to_ldm
    state = pipeline_to_ldm(model.arch, model.unet, model.vae, model.text_encoders)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    metadata = {"format": "pt", META_ARCH: model.arch,
                META_CONFIG: json.dumps(collect_config_files(model), sort_keys=True)}
    metadata.update(extra_metadata or {})
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, out)  # never leave a half-written checkpoint under the final name
    return out


def save_single_file(model_dir: str | Path, out_file: str | Path, dtype=None) -> Path:
    """Convert a diffusers model folder to an original-layout single `.safetensors` file."""
    from .loader import load_model
    return export_single_file(load_model(str(model_dir)), out_file, dtype=dtype)
