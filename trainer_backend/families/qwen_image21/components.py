"""Qwen-Image 2.1 from the separate files ComfyUI users keep, offline: the transformer (`model.path`,
models/diffusion_models/: diffusers' names with each block's gate/up fused into `img_mlp.gate_up`, optionally
under `model.diffusion_model.`, bf16 or ComfyUI's scaled fp8: single_file.py has the layout), the Qwen3-VL-8B
text encoder with its vision tower (`model.text_encoder`, models/text_encoders/: qwen3vl_file.py; the edit
mode reads the control image through it) and the RGBA autoencoder (`model.vae`: ComfyUI's file, in the Wan 2.2
VAE's original names with 1-frame 3-D convolutions; a file in diffusers' names; or a VAE folder). Each file is
checked key by key and read one tensor at a time (fp8 as bf16). The processor (tokenizer + image processor)
comes from `model.tokenizer`, a Qwen-Image 2.1 diffusers folder (processor/)."""
from __future__ import annotations

import re
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
    """model.vae: an AutoencoderKLQwenImage21 folder, or one file in ComfyUI's layout (the Wan 2.2 VAE's names:
    vae_from_original_one) or in diffusers' names, checked key by key and read one tensor at a time."""
    from diffusers import AutoencoderKLQwenImage21
    from .single_file import load_vae as load_vae_folder
    if not path_str:
        raise ConfigError("model.vae: a Qwen-Image 2.1 transformer file holds no autoencoder; give the VAE file "
                          "or a diffusers VAE folder")
    path = Path(path_str).expanduser()
    if path.is_dir():
        return load_vae_folder(str(path / "vae" if (path / "vae" / "config.json").is_file() else path))
    shapes, metadata = header("model.vae", path)
    with weights_on_meta():
        vae = AutoencoderKLQwenImage21.from_config(own_config(metadata, bundled("qwen_image21", "vae/config.json")))
    expected = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
    prefix = next((p for p in VAE_PREFIXES if any(k.startswith(p) for k in shapes)), "")
    convert = vae_from_original_one if _original_vae(path, {k[len(prefix):]: v for k, v in shapes.items()}) \
        else (lambda name, t: {name: t})
    stream_into("model.vae", path, vae, convert, expected, "Qwen-Image 2.1 autoencoder", prefix=prefix,
                dtype=__import__("torch").float32)
    return vae


# ComfyUI's Qwen-Image 2.1 VAE file: the Wan 2.2 VAE's original module names (comfy/ldm/wan/vae2_2.py, which
# ComfyUI builds for it with temporal kernel 1, no patchify, RGBA), its causal 3-D convolutions stored 5-D with
# one frame; diffusers' AutoencoderKLQwenImage21 has the same modules under its own names, as 2-D convolutions.
VAE_PREFIXES = ("first_stage_model.", "vae.")
_VAE_MARK = "decoder.middle.0.residual.0.gamma"     # the key ComfyUI detects a Wan-layout VAE by
_VAE_22_MARK = "decoder.upsamples.0.upsamples.0.residual.2.weight"  # ... and its Wan 2.2 layout by
_STAGES = {"encoder": ("downsamples", "down_blocks", "downsampler"), "decoder": ("upsamples", "up_blocks", "upsampler")}
_RESIDUAL = (("residual.0.", "norm1."), ("residual.2.", "conv1."), ("residual.3.", "norm2."), ("residual.6.", "conv2."),
             ("shortcut.", "conv_shortcut."))
_MIDDLE = (("middle.0.", "mid_block.resnets.0."), ("middle.1.", "mid_block.attentions.0."),
           ("middle.2.", "mid_block.resnets.1."))
_ENDS = (("conv1.", "conv_in."), ("head.0.", "norm_out."), ("head.2.", "conv_out."))
_TOP = (("conv1.", "quant_conv."), ("conv2.", "post_quant_conv."))
_BLOCK = re.compile(r"(encoder|decoder)\.(downsamples|upsamples)\.(\d+)\.(?:downsamples|upsamples)\.(\d+)\.(.*)")
_DIFFUSERS_BLOCK = re.compile(r"(encoder|decoder)\.(?:down_blocks|up_blocks)\.(\d+)\."
                              r"(resnets\.(\d+)|downsampler|upsampler)\.(.*)")


def _swap(name: str, pairs, reverse: bool = False) -> str:
    """`name` with its first matching prefix of `pairs` replaced (old -> new, or new -> old when reverse)."""
    for old, new in pairs:
        old, new = (new, old) if reverse else (old, new)
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _original_vae(path: Path, shapes: dict) -> bool:
    """Whether the file is in the original (ComfyUI) layout; a Wan VAE that is not Qwen-Image 2.1's is refused
    in one line naming what it is."""
    if _VAE_MARK not in shapes:
        return False
    head = tuple(shapes.get("decoder.head.2.weight", ()))
    if _VAE_22_MARK not in shapes:
        raise ConfigError(f"model.vae: {path.name} is a Wan 2.1-layout VAE (Qwen-Image's or Wan's), not "
                          "Qwen-Image 2.1's: it has no " + _VAE_22_MARK)
    if len(head) == 5 and head[2] != 1:
        raise ConfigError(f"model.vae: {path.name} is a Wan 2.2 video VAE (decoder.head.2.weight is {list(head)}, "
                          "3 frames deep), not Qwen-Image 2.1's image VAE (1 frame)")
    return True


def vae_name_from_original(name: str) -> str:
    """One original-layout (ComfyUI) VAE tensor name -> diffusers' AutoencoderKLQwenImage21 name."""
    part, _, rest = name.partition(".")
    if part not in _STAGES:
        return _swap(name, _TOP)
    block = _BLOCK.fullmatch(name)
    if block:  # a stage's residual blocks, then its resample (the last entry): diffusers' resnets, then its sampler
        _, _, i, j, tail = block.groups()
        _, blocks, sampler = _STAGES[part]
        renamed = _swap(tail, _RESIDUAL)
        if renamed != tail:
            return f"{part}.{blocks}.{i}.resnets.{j}.{renamed}"
        return f"{part}.{blocks}.{i}.{sampler}.{tail}"
    if rest.startswith("middle."):
        index, tail = rest[:len("middle.0.")], rest[len("middle.0."):]
        return f"{part}.{_swap(index, _MIDDLE)}{_swap(tail, _RESIDUAL)}"
    return f"{part}.{_swap(rest, _ENDS)}"


def vae_from_original_one(name: str, tensor) -> dict:
    """One original-layout tensor as diffusers' (a one-frame 3-D convolution's weight as the 2-D one)."""
    if tensor.dim() == 5 and tensor.shape[2] == 1:
        tensor = tensor.squeeze(2)
    return {vae_name_from_original(name): tensor}


def vae_to_original(state: dict) -> dict:
    """diffusers' AutoencoderKLQwenImage21 state -> ComfyUI's file layout, its causal convolutions 5-D with one
    frame (every convolution but a resample's and the attention's 2-D ones): the inverse of
    vae_from_original_one, for the tests and the layout check."""
    resnets: dict[tuple[str, str], int] = {}  # a stage's block -> its residual blocks (its resample comes next)
    for key in state:
        m = _DIFFUSERS_BLOCK.fullmatch(key)
        if m and m.group(4) is not None:
            resnets[m.group(1), m.group(2)] = max(resnets.get((m.group(1), m.group(2)), 0), int(m.group(4)) + 1)
    out = {}
    for key, value in state.items():
        part, _, rest = key.partition(".")
        m = _DIFFUSERS_BLOCK.fullmatch(key)
        if part not in _STAGES:
            name = _swap(key, _TOP, reverse=True)
        elif m:
            stage, i, what, j, tail = m.groups()
            blocks = _STAGES[stage][0]
            name = f"{stage}.{blocks}.{i}.{blocks}." + (f"{j}.{_swap(tail, _RESIDUAL, reverse=True)}" if j is not None
                                                        else f"{resnets[stage, i]}.{tail}")
        elif rest.startswith("mid_block."):
            middle = _swap(rest, _MIDDLE, reverse=True)
            index, tail = middle[:len("middle.0.")], middle[len("middle.0."):]
            name = f"{part}.{index}{_swap(tail, _RESIDUAL, reverse=True)}"
        else:
            name = f"{part}.{_swap(rest, _ENDS, reverse=True)}"
        causal = name.endswith(".weight") and value.dim() == 4 and ".resample." not in name and ".middle.1." not in name
        out[name] = value.unsqueeze(2) if causal else value
    return out


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
