"""Flux.2 dev's text encoder (Mistral Small 3.x 24B) from the single file ComfyUI users keep
(`models/text_encoders/mistral_3_small_flux2_bf16.safetensors`, or its fp8 variant), offline, as the
`Mistral3ForConditionalGeneration` Flux2Pipeline holds.

ComfyUI's file stores the text model under `model.` with the plain Mistral names
(`model.layers.N.self_attn.q_proj.weight`, `model.embed_tokens.weight`, `model.norm.weight`), the
Pixtral vision tower and its projector beside it (`vision_tower.*`, `multi_modal_projector.*`) and the
Tekken tokenizer as a byte tensor (`tekken_model`); a file saved by ComfyUI's CLIP save node has it all
under `text_encoders.mistral3_24b.transformer.`. Transformers' own layouts (`model.language_model.*`,
and version 4's `language_model.model.*`) read too. The fp8 files keep each Linear weight as float8
with a scale (`<layer>.weight_scale`, older files `<layer>.scale_weight`): read as weight × scale.
The architecture is the bundled Mistral Small 3 config (assets/model_configs/flux2/), or the file's own
(`sd_studio.config`, this project's exports and tests). A file without the vision tower loads it as
zeros (text encoding never runs it); a file without `lm_head` ties it to the embedding (no logits are
ever computed). Files that do not fit are refused in one line naming the option, the file and the key.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import ConfigError
from ..component_files import FP8_SCALES, bundled, dequantize_fp8, header, load_checked, own_config, tokenizer_folders
from ..component_files import refuse_packed, strip, weights_on_meta

OPTION = "model.text_encoder"
CONFIG_FILE = "text_encoder-mistral-small-3.json"
CONTAINER_PREFIXES = ("text_encoders.mistral3_24b.transformer.",)
# (the file's prefix, transformers' prefix): first match wins, so transformers' own names come first
RENAMES = (("model.language_model.", "model.language_model."), ("model.vision_tower.", "model.vision_tower."),
           ("model.multi_modal_projector.", "model.multi_modal_projector."),
           ("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
           ("model.", "model.language_model."), ("vision_tower.", "model.vision_tower."),
           ("multi_modal_projector.", "model.multi_modal_projector."), ("lm_head.", "lm_head."))
# what the files carry besides weights: the tokenizer, quantization markers and activation scales
NOT_WEIGHTS = ("tekken_model", "scaled_fp8")
NOT_WEIGHT_SUFFIXES = (".comfy_quant", ".input_scale", *FP8_SCALES)
OPTIONAL = ("model.vision_tower.", "model.multi_modal_projector.")
HEAD = "lm_head.weight"
HF_CACHE = [("black-forest-labs/FLUX.2-dev", "tokenizer")]


def to_transformers_name(name: str) -> str | None:
    """A file's weight name -> Mistral3ForConditionalGeneration's (None: not a weight)."""
    if name in NOT_WEIGHTS or name.endswith(NOT_WEIGHT_SUFFIXES):
        return None
    for prefix, target in RENAMES:
        if name.startswith(prefix):
            return target + name[len(prefix):]
    return ""  # a weight of something else


def to_comfyui_layout(state: dict) -> dict:
    """Mistral3ForConditionalGeneration weights -> the names ComfyUI's file uses (lm_head left out, as
    there); the inverse of to_transformers_name."""
    out = {}
    for name, value in state.items():
        for comfy, ours in (("model.", "model.language_model."), ("vision_tower.", "model.vision_tower."),
                            ("multi_modal_projector.", "model.multi_modal_projector.")):
            if name.startswith(ours):
                out[comfy + name[len(ours):]] = value
    return out


def renamed(option: str, path: Path, names: dict) -> dict:
    """{transformers name: the file's value} for every weight of the file; an unknown weight: one line."""
    out = {}
    for name, value in strip(names, CONTAINER_PREFIXES).items():
        ours = to_transformers_name(name)
        if ours == "":
            raise ConfigError(f"{option}: {path.name} is not a Mistral Small 3 text encoder: it has {name}, "
                              "which Flux.2 dev's text encoder does not")
        if ours:
            out[ours] = value
    return out


def load_mistral_text_encoder(path_str: str):
    """Mistral3ForConditionalGeneration (fp32) from the text-encoder file `path_str`."""
    import torch
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration
    if not path_str:
        raise ConfigError(f"{OPTION}: a Flux.2 dev transformer file holds no text encoder; give the Mistral Small "
                          "3 file (ComfyUI's models/text_encoders/mistral_3_small_flux2_bf16.safetensors)")
    path = Path(path_str).expanduser()
    shapes, metadata = header(OPTION, path)
    names = renamed(OPTION, path, shapes)
    width = names.get("model.language_model.embed_tokens.weight", (0, 0))[1]
    own = own_config(metadata, {})
    own = own if "text_config" in own else {}
    if not own and width != 5120:
        raise ConfigError(f"{OPTION}: {path.name} is not a Mistral Small 3 text encoder (no model.embed_tokens."
                          "weight of width 5120)")
    config = Mistral3Config.from_dict(own or bundled("flux2", CONFIG_FILE))
    layers = config.text_config.num_hidden_layers
    if not own and f"model.language_model.layers.{layers - 1}.input_layernorm.weight" not in names:
        present = {int(k.split(".")[3]) for k in names if k.startswith("model.language_model.layers.")}
        raise ConfigError(f"{OPTION}: {path.name} has {len(present)} of Mistral Small 3's {layers} layers (a "
                          "pruned or truncated file); Flux.2 dev's text encoding needs the whole model: use "
                          "mistral_3_small_flux2_bf16.safetensors or the fp8 file")
    refuse_packed(OPTION, path, "mistral_3_small_flux2_bf16.safetensors")
    with weights_on_meta():
        model = Mistral3ForConditionalGeneration(config)
    like = {k: v.shape for k, v in model.state_dict().items()}
    with_vision = any(k.startswith(OPTIONAL) for k in names)
    expected = {k: s for k, s in like.items() if k != HEAD and (with_vision or not k.startswith(OPTIONAL))}
    absent = [k for k in like if k not in expected]
    load_checked(OPTION, path, model, "Mistral Small 3 text encoder of this size", names, expected,
                 lambda state: {k: v for k, v in renamed(OPTION, path, dequantize_fp8(strip(state, CONTAINER_PREFIXES))).items() if k in like},
                 skip=tuple(absent))
    for name in absent:
        if name == HEAD:
            continue
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        setattr(module, attr, torch.nn.Parameter(torch.zeros(like[name]), requires_grad=False))
    if HEAD not in names:
        model.lm_head.weight = model.model.language_model.embed_tokens.weight
    return model


def load_mistral_tokenizer(folder: Path):
    """Flux.2 dev's tokenizer: the tokenizer inside its PixtralProcessor folder (text encoding renders the
    processor's chat template with it; the processor itself needs torchvision), with the chat template
    from wherever the folder keeps it (chat_template.jinja, chat_template.json, processor_config.json)."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if not tokenizer.chat_template:
        for name, key in (("chat_template.jinja", None), ("chat_template.json", "chat_template"),
                          ("processor_config.json", "chat_template")):
            path = Path(folder) / name
            if path.is_file():
                text = path.read_text(encoding="utf-8")
                template = json.loads(text).get(key) if key else text
                if template:
                    tokenizer.chat_template = template
                    break
    return tokenizer


def find_mistral_tokenizer(folder: str):
    """Flux.2 dev's tokenizer from model.tokenizer (a FLUX.2-dev diffusers folder with tokenizer/, or that
    tokenizer folder itself) or the local Hugging Face cache (never fetched)."""
    for c in tokenizer_folders(folder, HF_CACHE, ("tokenizer.json", "tekken.json")):
        try:
            return load_mistral_tokenizer(c)
        except (OSError, ValueError, json.JSONDecodeError) as e:
            raise ConfigError(f"model.tokenizer: {c} holds no Flux.2 dev tokenizer "
                              f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    raise ConfigError("model.tokenizer: Flux.2 dev's single files hold no tokenizer transformers reads; set "
                      "model.tokenizer to a FLUX.2-dev diffusers folder (with tokenizer/) or its tokenizer folder"
                      + (f"; none found in {folder}" if folder else " (none in the Hugging Face cache either)"))
