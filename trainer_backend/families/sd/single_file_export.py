"""Single-file export: a model's UNet, VAE and text encoders as one original-layout
`.safetensors` file (A1111, ComfyUI and diffusers' `from_single_file` load it), with the
model's small config files embedded in its metadata so this project reloads it offline."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .single_file import _SAFE_CONFIG_PATH, META_ARCH, META_CONFIG

if TYPE_CHECKING:
    from ..base import LoadedModel

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
