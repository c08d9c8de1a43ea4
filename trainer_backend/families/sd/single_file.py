"""Single-file checkpoints: inspection and the configs embedded in them (export: single_file_export.py).

An exported file is an ordinary original-layout `.safetensors` (A1111, ComfyUI and diffusers'
`from_single_file` load it). Its metadata also carries the small config files of the model it
came from (`sd_studio.arch`, `sd_studio.config`), so this project reloads it offline and
exactly, tokenizer included, even for tiny or custom-sized models whose shapes match no
bundled config.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ...errors import ConfigError
from ...file_limits import check_float_weights, dtype_code
from ..builtin import atomic_dir


META_ARCH = "sd_studio.arch"
META_CONFIG = "sd_studio.config"
SINGLE_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth")
# Only plain config/tokenizer files may be materialized from a checkpoint's metadata.
_SAFE_CONFIG_PATH = re.compile(r"^(?:[A-Za-z0-9_]+/)?[A-Za-z0-9_][A-Za-z0-9_.\-]*\.(?:json|txt)$")


# ----------------------------------------------------------------------------- reading

def read_keys_and_metadata(path: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Weight names -> shapes, and the file's metadata, without loading the weights."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        try:
            with safe_open(str(path), framework="pt") as f:
                slices = {k: f.get_slice(k) for k in f.keys()}
                shapes = {k: tuple(s.get_shape()) for k, s in slices.items()}
                dtypes = {k: s.get_dtype() for k, s in slices.items()}
                metadata = dict(f.metadata() or {})
        except Exception as e:  # safetensors raises several types for a corrupt header
            raise ConfigError(f"model.path: {path} is not a readable .safetensors file ({e})") from None
        check_float_weights("model.path", path, dtypes)  # an F32 weight relabelled I32 keeps its size
        return shapes, metadata
    from ...run.safe_load import load_pickled  # tensors only; one line, never torch's weights_only=False advice
    state = load_pickled(path, key="model.path", what="a model file never needs code to load (prefer its "
                         ".safetensors release)")
    state = state.get("state_dict", state) if isinstance(state, dict) else {}
    check_float_weights("model.path", path, {k: dtype_code(v.dtype) for k, v in state.items() if hasattr(v, "dtype")})
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
