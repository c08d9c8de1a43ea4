"""Model families behind one contract (base.py), registered in registry.py.

The rest of the backend uses this package's functions and the `LoadedModel.family` it gets back;
it never imports a family's folder directly. Heavy imports happen inside the functions.
"""
from __future__ import annotations

import json
from pathlib import Path

from .registry import BUILTIN_TINY, FAMILY_NAMES, all_families, get_family

__all__ = ["FAMILY_NAMES", "get_family", "all_families", "detect_family", "load_model", "load_configured",
           "build_tiny_model",
           "resolve_model_path", "build_pipeline", "repo_files"]


from .builtin import resolve_model_path  # noqa: E402  (builtin:tiny-<family> paths)


def _existing(path: str) -> Path:
    from ..errors import ConfigError
    if not str(path).strip():
        raise ConfigError("model.path: is empty; give a diffusers folder, a .safetensors checkpoint or "
                          + "|".join(f"builtin:{n}" for n in BUILTIN_TINY))
    from ..file_limits import check_readable_path
    src = resolve_model_path(path)
    check_readable_path("model.path", src, folder_ok=True)  # a FIFO or device would hang the loader
    if not src.exists():
        raise ConfigError(f"model.path: {src} does not exist")
    return src


def detect_family(path: str):
    """The Family of a diffusers folder, single file or builtin: name (ConfigError naming model.path)."""
    from ..errors import ConfigError
    from .sd.loader import _detect_file, _first_line
    src = _existing(path)
    if src.is_dir():
        index_file = src / "model_index.json"
        if not index_file.is_file():
            raise ConfigError(f"model.path: {src} is not a diffusers model folder (no model_index.json)")
        try:
            index = json.loads(index_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"model.path: {src} has an unreadable model_index.json ({_first_line(e)})") from None
        for family in all_families():
            if family.detect_folder(src, index):
                return family
        cls = index.get("_class_name", "") or "unknown"
        labels = ", ".join(f.label for f in all_families())
        raise ConfigError(f"model.path: {src} holds a {cls} model; supported families: {labels}")
    # single files: the embedded family name (our own exports), else each family's key check
    from .sd.single_file import META_ARCH, read_keys_and_metadata
    from .sd.loader import SINGLE_FILE_SUFFIXES
    if src.suffix.lower() not in SINGLE_FILE_SUFFIXES:
        return get_family(_detect_file(src))  # raises the "not a model" message
    shapes, metadata = read_keys_and_metadata(src)
    if metadata.get(META_ARCH) in FAMILY_NAMES:
        return get_family(metadata[META_ARCH])
    for family in all_families():
        if family.detect_file(shapes, metadata):
            return family
    labels = ", ".join(f.label for f in all_families())
    raise ConfigError(f"model.path: {src} is not a checkpoint of a supported family ({labels}) in the "
                      "original key layout")


def repo_files(probe_folder: Path, files: list[str]) -> tuple[list[str], str]:
    """The files of a hub pipeline repo its family loads, and the family's name: the family is detected from
    the repo's small files already in `probe_folder` (model_index.json and the components' config.json)."""
    family = detect_family(str(probe_folder))
    index = json.loads((Path(probe_folder) / "model_index.json").read_text(encoding="utf-8"))
    return family.hub_files(files, index), family.name


def load_model(path: str, arch: str = "auto", vae: str = "", prediction_type: str = "auto", tokenizer: str = "",
               text_encoder_files: dict[str, str] | None = None, model_options: dict | None = None,
               frozen_quantize: str = "none", frozen_quantize_text_encoders: str = "none"):
    """Detect the family, check it against `model.arch`, and let the family load the model (fp32).
    text_encoder_files: model.<option> -> path of separate text-encoder files (Flux single files).
    frozen_quantize: the storage the run will quantize the frozen denoiser to (model.quantize); a
    transformer file read tensor by tensor arrives in it (float8: component_files.frozen_storage); likewise
    frozen_quantize_text_encoders (model.quantize_text_encoders) for a text-encoder file read so."""
    from ..errors import ConfigError
    family = detect_family(path)
    if arch not in ("auto", family.name) and family_accepts_file(arch, resolve_model_path(path)):
        family = get_family(arch)  # one file two families read alike (Qwen-Image and -Edit transformers)
    if arch not in ("auto", family.name):
        raise ConfigError(f"model.arch: is {arch!r} but {resolve_model_path(path)} is an {family.name} model "
                          "(use \"auto\")")
    files = {k: v for k, v in (text_encoder_files or {}).items() if v}
    extra = [k for k in files if k not in family.text_encoder_file_options]
    if extra:
        raise ConfigError(f"model.{extra[0]}: does not apply to a {family.label} model")
    options = {"text_encoder_files": files} if family.text_encoder_file_options else {}
    options.update({k: v for k, v in (model_options or {}).items() if k in family.model_options})
    from .component_files import frozen_storage
    with frozen_storage(frozen_quantize, getattr(family, "keep_unquantized", ()), frozen_quantize_text_encoders):
        return family.load(resolve_model_path(path), vae=vae, prediction_type=prediction_type, tokenizer=tokenizer,
                           **options)


def family_accepts_file(arch: str, src: Path) -> bool:
    """model.arch names a family that also reads this single file (detection picked another first)."""
    from .sd.loader import SINGLE_FILE_SUFFIXES
    if arch not in FAMILY_NAMES or not src.is_file() or src.suffix.lower() not in SINGLE_FILE_SUFFIXES:
        return False
    from .sd.single_file import read_keys_and_metadata
    return get_family(arch).detect_file(*read_keys_and_metadata(src))


def load_configured(model_section, frozen_quantize: str = "none", frozen_quantize_text_encoders: str = "none"):
    """load_model with a config's [model] section (its path, arch, vae, prediction_type, tokenizer and
    every family's text-encoder file options). `frozen_quantize(_text_encoders)`: model.quantize(_text_encoders)
    when the run will quantize the frozen base (load_model)."""
    m = model_section
    families = all_families()
    options = {name for f in families for name in f.text_encoder_file_options}
    own = {name for f in families for name in f.model_options}  # a family's own load options (Wan's expert)
    return load_model(m.path, arch=m.arch, vae=m.vae, prediction_type=m.prediction_type, tokenizer=m.tokenizer,
                      text_encoder_files={name: getattr(m, name, "") for name in sorted(options)},
                      model_options={name: getattr(m, name) for name in sorted(own) if hasattr(m, name)},
                      frozen_quantize=frozen_quantize, frozen_quantize_text_encoders=frozen_quantize_text_encoders)


def build_tiny_model(arch: str, out_dir, seed: int = 0, **options) -> Path:
    """A tiny random model of a registered family, as a diffusers folder."""
    from ..errors import ConfigError
    if arch not in FAMILY_NAMES:
        raise ConfigError(f"model.arch: tiny models exist for {', '.join(FAMILY_NAMES)}, got {arch!r}")
    return get_family(arch).build_tiny(out_dir, seed=seed, **options)


def build_pipeline(model, scheduler: str = "euler"):
    """The model's family's sampling pipeline over the model's own modules."""
    return model.family.build_pipeline(model, scheduler)
