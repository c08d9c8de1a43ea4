"""Qwen-Image 2.1 from the separate files ComfyUI users keep, offline: the transformer (`model.path`,
models/diffusion_models/: diffusers' names with each block's gate/up fused into `img_mlp.gate_up`, optionally
under `model.diffusion_model.`, bf16 or ComfyUI's scaled fp8: single_file.py has the layout), the Qwen3-VL-8B
text encoder with its vision tower (`model.text_encoder`, models/text_encoders/: qwen3vl_file.py; the edit
mode reads the control image through it) and the RGBA autoencoder (`model.vae`: a file in diffusers' names or
a VAE folder). Each file is checked key by key and read one tensor at a time (fp8 as bf16). The processor
(tokenizer + image processor) comes from `model.tokenizer`, a Qwen-Image 2.1 diffusers folder (processor/)."""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..component_files import bundled, header, own_config, stream_into, stream_transformer, weights_on_meta


def load_transformer(path: Path, dtype=None):
    from diffusers import QwenImage21Transformer2DModel
    from .single_file import to_diffusers
    return stream_transformer(QwenImage21Transformer2DModel, "model.path", path,
                              bundled("qwen_image21", "transformer/config.json"), lambda name, t: to_diffusers({name: t}),
                              "Qwen-Image 2.1 transformer of this size", "the bf16 or fp8 file", dtype=dtype)


def load_vae(path_str: str):
    """model.vae: an AutoencoderKLQwenImage21 folder, or one file in diffusers' names (checked key by key)."""
    from diffusers import AutoencoderKLQwenImage21
    from .single_file import load_vae as load_vae_folder
    if not path_str:
        raise ConfigError("model.vae: a Qwen-Image 2.1 transformer file holds no autoencoder; give the VAE file "
                          "or a diffusers VAE folder")
    path = Path(path_str).expanduser()
    if path.is_dir():
        return load_vae_folder(str(path / "vae" if (path / "vae" / "config.json").is_file() else path))
    _, metadata = header("model.vae", path)
    with weights_on_meta():
        vae = AutoencoderKLQwenImage21.from_config(own_config(metadata, bundled("qwen_image21", "vae/config.json")))
    expected = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
    stream_into("model.vae", path, vae, lambda name, t: {name.removeprefix("vae."): t}, expected,
                "Qwen-Image 2.1 autoencoder", dtype=__import__("torch").float32)
    return vae


def load_qwen_image21_files(family, src: Path, *, vae: str, tokenizer: str, files: dict[str, str]) -> LoadedModel:
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import Qwen3VLForConditionalGeneration
    from ..qwen3vl_file import load_qwen3vl
    from .text import load_processor
    from .tiny import scheduler_config
    transformer = load_transformer(src)
    text_encoder = load_qwen3vl(files.get("text_encoder", ""), Qwen3VLForConditionalGeneration,
                                bundled("qwen_image21", "text_encoder/config.json"), "Qwen-Image 2.1",
                                "ComfyUI's models/text_encoders/ Qwen3-VL-8B file", vision_needed=True)
    width, takes = text_encoder.config.text_config.hidden_size, transformer.config.context_in_dim
    if width != takes:
        raise ConfigError(f"model.text_encoder: a {width}-wide Qwen3-VL does not fit this transformer (it takes "
                          f"{takes}-wide text)")
    autoencoder = load_vae(vae)
    folder = Path(tokenizer).expanduser() if tokenizer else None
    if folder is None or not (folder / "processor").is_dir():
        raise ConfigError("model.tokenizer: Qwen-Image 2.1 files hold no tokenizer or image processor; set "
                          "model.tokenizer to a Qwen-Image 2.1 diffusers folder (with processor/)"
                          + (f"; {folder} has no processor/" if folder else ""))
    sched = folder / "scheduler"
    config = FlowMatchEulerDiscreteScheduler.load_config(str(sched)) if (sched / "scheduler_config.json").is_file() \
        else scheduler_config()
    return family.loaded(src, transformer, autoencoder, text_encoder, load_processor(folder / "processor"), dict(config))
