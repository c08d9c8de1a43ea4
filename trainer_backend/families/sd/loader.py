"""Load SD1 / SD2 / SDXL models from a diffusers folder, a single-file checkpoint or `builtin:`.

Everything comes back as plain fp32 modules in a `LoadedModel`; precision, devices and what
is trainable are the training method's business. `build_pipeline` wraps the very same
module objects in a diffusers pipeline, so samples show what training changed.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ...errors import ConfigError
from ...file_limits import check_float_weights, check_readable_path
from ..base import LoadedModel
from .single_file import (META_ARCH, SINGLE_FILE_SUFFIXES, detect_arch_from_keys,
                          materialize_embedded_config, read_keys_and_metadata)
from ..builtin import cache_root, resolve_model_path
from .tiny import ARCHES
from .tokenizers import find_tokenizers

ASSETS_CONFIGS = Path(__file__).resolve().parents[3] / "assets" / "model_configs"
PIPELINE_CLASS = {"sd1": "StableDiffusionPipeline", "sd2": "StableDiffusionPipeline",
                  "sdxl": "StableDiffusionXLPipeline"}
SAMPLERS = {"euler": "EulerDiscreteScheduler", "euler_a": "EulerAncestralDiscreteScheduler",
            "ddim": "DDIMScheduler", "dpmpp_2m": "DPMSolverMultistepScheduler", "pndm": "PNDMScheduler",
            "unipc": "UniPCMultistepScheduler", "ddpm": "DDPMScheduler"}


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def _detect_folder(folder: Path) -> str:
    index_file = folder / "model_index.json"
    if not index_file.is_file():
        raise ConfigError(f"model.path: {folder} is not a diffusers model folder (no model_index.json)")
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
        unet_cfg = json.loads((folder / "unet" / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"model.path: {folder} has an unreadable model_index.json or unet/config.json "
                          f"({_first_line(e)})") from None
    found = arch_of_folder(index, unet_cfg)
    if found is None:
        cls = index.get("_class_name", "")
        raise ConfigError(f"model.path: {folder} holds a {cls or 'unknown'} model; SD1, SD2 and SDXL are supported")
    return found


def arch_of_folder(index: dict, unet_cfg: dict) -> str | None:
    """sd1 | sd2 | sdxl from a diffusers folder's model_index.json and unet/config.json, else None."""
    cls = index.get("_class_name", "")
    if cls == "StableDiffusionXLPipeline" or unet_cfg.get("addition_embed_type") == "text_time":
        return "sdxl"
    if cls != "StableDiffusionPipeline":
        return None
    # SD2 UNets use linear projections in their transformers and OpenCLIP-H's 1024-wide context.
    if unet_cfg.get("use_linear_projection") or unet_cfg.get("cross_attention_dim") == 1024:
        return "sd2"
    return "sd1"


def _detect_file(path: Path) -> str:
    if path.suffix.lower() not in SINGLE_FILE_SUFFIXES:
        raise ConfigError(f"model.path: {path} is not a model (expected a diffusers folder or one of "
                          f"{', '.join(SINGLE_FILE_SUFFIXES)})")
    shapes, metadata = read_keys_and_metadata(path)
    arch = metadata.get(META_ARCH) if metadata.get(META_ARCH) in ARCHES else detect_arch_from_keys(shapes)
    if arch is None:
        raise ConfigError(f"model.path: {path} is not an SD1/SD2/SDXL checkpoint in the original key layout")
    return arch


def _existing(path: str) -> Path:
    if not str(path).strip():
        raise ConfigError("model.path: is empty; give a diffusers folder, a .safetensors checkpoint or "
                          "builtin:tiny-sd1|tiny-sd2|tiny-sdxl")
    src = resolve_model_path(path)
    if not src.exists():
        raise ConfigError(f"model.path: {src} does not exist")
    return src


def detect_arch(path: str) -> str:
    """"sd1" | "sd2" | "sdxl" for a diffusers folder, a single file or a builtin: name."""
    src = _existing(path)
    return _detect_folder(src) if src.is_dir() else _detect_file(src)


def _pipeline_class(arch: str):
    import diffusers
    return getattr(diffusers, PIPELINE_CLASS[arch])


def _no_safety_checker(arch: str) -> dict:
    if arch == "sdxl":
        return {}
    return {"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False}


def _load_folder(src: Path, arch: str):
    import torch
    try:
        return _pipeline_class(arch).from_pretrained(str(src), local_files_only=True, dtype=torch.float32,
                                                     **_no_safety_checker(arch))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ConfigError(f"model.path: cannot load {src} ({_first_line(e)})") from None


def _load_file(src: Path, arch: str, tokenizer: str):
    import torch
    _, metadata = read_keys_and_metadata(src)
    config_dir = materialize_embedded_config(metadata, cache_root() / "single-file-configs")
    kwargs = _no_safety_checker(arch)
    if config_dir is None or tokenizer:
        names = ["tokenizer", "tokenizer_2"]
        kwargs.update(zip(names, find_tokenizers(arch, tokenizer, config_dir)))
    if config_dir is None:
        config_dir = ASSETS_CONFIGS / arch
    try:
        return _pipeline_class(arch).from_single_file(str(src), config=str(config_dir), local_files_only=True,
                                                      dtype=torch.float32, **kwargs)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ConfigError(f"model.path: cannot load {src} as an {arch} checkpoint ({_first_line(e)})") from None


def _load_vae(spec: str, own_vae):
    """A replacement VAE: a diffusers folder (with config.json or vae/config.json) or a single file."""
    import torch
    from diffusers import AutoencoderKL
    p = Path(spec).expanduser()
    if not p.exists():
        raise ConfigError(f"model.vae: {p} does not exist")
    try:
        if p.is_dir():
            sub = "" if (p / "config.json").is_file() else "vae"
            if not (p / sub / "config.json").is_file():
                raise ConfigError(f"model.vae: {p} has neither config.json nor vae/config.json")
            return AutoencoderKL.from_pretrained(str(p), subfolder=sub or None, dtype=torch.float32,
                                                 local_files_only=True)
        # A single-file VAE is converted with the model's own VAE config (its latent scaling included).
        check_readable_path("model.vae", p)
        if p.suffix.lower() in (".safetensors", ".sft"):
            from safetensors import SafetensorError, safe_open
            try:
                with safe_open(str(p), framework="pt") as f:  # the header only: an F32 weight relabelled I32
                    dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
            except SafetensorError as e:
                raise ConfigError(f"model.vae: {p} is not a readable .safetensors file ({e})") from None
            check_float_weights("model.vae", p, dtypes)
        with tempfile.TemporaryDirectory() as tmp:
            own_vae.save_config(Path(tmp) / "vae")
            return AutoencoderKL.from_single_file(str(p), config=tmp, subfolder="vae", local_files_only=True,
                                                  dtype=torch.float32)
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ConfigError(f"model.vae: cannot load {p} ({_first_line(e)})") from None


def load_model(path: str, arch: str = "auto", vae: str = "", prediction_type: str = "auto",
               tokenizer: str = "") -> LoadedModel:
    """Load a model in fp32. `tokenizer` is only needed for single files without tokenizer info
    (see docs/models.md); errors are ConfigError naming model.path / model.vae / model.arch."""
    from diffusers import DDPMScheduler
    src = _existing(path)
    found = _detect_folder(src) if src.is_dir() else _detect_file(src)
    if arch not in ("auto", found):
        raise ConfigError(f"model.arch: is {arch!r} but {src} is an {found} model (use \"auto\")")
    pipe = _load_folder(src, found) if src.is_dir() else _load_file(src, found, tokenizer)
    if vae:
        pipe.vae = _load_vae(vae, pipe.vae)
    scheduler_config = dict(pipe.scheduler.config)
    if prediction_type == "auto":
        prediction_type = scheduler_config.get("prediction_type", "epsilon")
    if prediction_type not in ("epsilon", "v_prediction"):
        raise ConfigError(f"model.prediction_type: {prediction_type!r} is not supported (epsilon or v_prediction)")
    noise_scheduler = DDPMScheduler.from_config(scheduler_config, prediction_type=prediction_type,
                                                clip_sample=scheduler_config.get("clip_sample", False))
    text_encoders = [pipe.text_encoder] + ([pipe.text_encoder_2] if found == "sdxl" else [])
    tokenizers = [pipe.tokenizer] + ([pipe.tokenizer_2] if found == "sdxl" else [])
    from ..registry import get_family
    return LoadedModel(family=get_family(found), denoiser=pipe.unet, vae=pipe.vae, text_encoders=text_encoders,
                       tokenizers=tokenizers, noise_scheduler=noise_scheduler, prediction_type=prediction_type,
                       source=str(src), vae_scale_factor=2 ** (len(pipe.vae.config.block_out_channels) - 1),
                       scheduler_config=scheduler_config)


def build_pipeline(model: LoadedModel, scheduler: str = "euler"):
    """A diffusers pipeline over the model's own module objects (LoRA layers included).

    scheduler: "default" (the model's own) or one of SAMPLERS; it predicts model.prediction_type.
    """
    import diffusers
    config = dict(model.scheduler_config or model.noise_scheduler.config)
    if scheduler == "default":
        cls_name = config.get("_class_name", "DDPMScheduler")
    elif scheduler in SAMPLERS:
        cls_name = SAMPLERS[scheduler]
    else:
        raise ConfigError(f"sampling.scheduler: unknown scheduler {scheduler!r} (choose default, "
                          f"{', '.join(SAMPLERS)})")
    # SD latents are not in [-1, 1]: a config without clip_sample (PNDM's) must not get DDIM's default True.
    sampler = getattr(diffusers, cls_name).from_config(config, prediction_type=model.prediction_type,
                                                       clip_sample=config.get("clip_sample", False))
    parts = dict(vae=model.vae, unet=model.unet, scheduler=sampler,
                 text_encoder=model.text_encoders[0], tokenizer=model.tokenizers[0])
    if model.arch == "sdxl":
        parts.update(text_encoder_2=model.text_encoders[1], tokenizer_2=model.tokenizers[1])
    pipe = _pipeline_class(model.arch)(**parts, **_no_safety_checker(model.arch))
    pipe.set_progress_bar_config(disable=True)
    return pipe
