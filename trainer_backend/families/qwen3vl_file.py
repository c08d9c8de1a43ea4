"""A Qwen3-VL text encoder from the one file ComfyUI keeps in models/text_encoders/ (Krea 2's Qwen3-VL-4B,
Qwen-Image 2.1's and Ideogram 4's Qwen3-VL-8B, e.g. `qwen3vl_8b_fp8_scaled.safetensors`), offline.

ComfyUI's files name the language model as transformers 4's text models do (`model.embed_tokens`,
`model.layers.N.self_attn.q_proj`, `model.norm`, maybe `lm_head`), the vision tower `visual.…`, optionally
under `text_encoders.qwen3vl_8b.transformer.`; files saved by transformers (`model.language_model.…`,
`model.visual.…`) load too. The architecture is the bundled full-size config, or the config a file
written by this project carries (`sd_studio.config`). The file is checked key by key before anything
loads and read one tensor at a time (fp8 weights × their scales; component_files.stream_into). A file
without the vision tower loads for families that never run it (`vision_needed=False`): its weights are
zeros then; without the final norm likewise where the taps stop before it. With model.quantize_text_encoders =
"float8" the Linear weights arrive in float8 storage (component_files.frozen_storage)."""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigError
from .component_files import header, own_config, refuse_packed, stored_float8, stream_into, weights_on_meta

PREFIX_RE = re.compile(r"^text_encoders\.qwen3vl_\w+?\.transformer\.")


def hf_name(name: str, conditional: bool) -> str:
    """A file's name -> the transformers 5 name in Qwen3VLModel (`conditional`: ForConditionalGeneration)."""
    name = PREFIX_RE.sub("", name)
    if name.startswith("model.language_model."):
        name = "language_model." + name[len("model.language_model."):]
    elif name.startswith("model.visual."):
        name = "visual." + name[len("model.visual."):]
    elif name.startswith("model."):
        name = "language_model." + name[len("model."):]
    elif name.startswith(("language_model.", "visual.", "lm_head.")):
        pass
    if conditional and not name.startswith("lm_head."):
        name = "model." + name
    return name


def comfy_name(key: str) -> str:
    """A Qwen3VLModel / ForConditionalGeneration state key -> ComfyUI's name (what the test files use)."""
    key = key.removeprefix("model.")
    if key.startswith("language_model."):
        return "model." + key[len("language_model."):]
    return key  # visual.…, lm_head.…


def load_qwen3vl(path_str: str, model_class, bundled_config: dict, label: str, hint: str, *,
                 vision_needed: bool, final_norm_needed: bool = True):
    """model.text_encoder: a `model_class` (transformers' Qwen3VLModel or Qwen3VLForConditionalGeneration)."""
    from transformers import Qwen3VLConfig
    if not path_str:
        raise ConfigError(f"model.text_encoder: a {label} transformer file holds no text encoder; give the Qwen3-VL file "
                          f"({hint})")
    path = Path(path_str).expanduser()
    _, metadata = header("model.text_encoder", path)
    config = Qwen3VLConfig(**own_config(metadata, bundled_config))
    with weights_on_meta():
        model = model_class(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    conditional = any(k.startswith("model.language_model.") for k in expected)
    head = "lm_head.weight"
    optional = {head} | ({k for k in expected if ".visual." in f".{k}"} if not vision_needed else set())
    if not final_norm_needed:
        optional |= {k for k in expected if k.endswith("language_model.norm.weight")}
    refuse_packed("model.text_encoder", path, "the bf16 or fp8_scaled file")
    stream_into("model.text_encoder", path, model, lambda n, t: {hf_name(n, conditional): t}, expected,
                f"Qwen3-VL text encoder of {label}'s size", optional=optional,
                float8=stored_float8(model, "text_encoder"))  # model.quantize_text_encoders = float8
    return model
