"""The captioner kinds: which transformers class (or ONNX tagger) reads which model folder, what it
writes by default, and how a folder is recognised (pure: no torch).

A folder is recognised by its config.json `model_type` (the transformers model classes) or by a
`model.onnx` beside `selected_tags.csv` (a WD14-style tagger, as SmilingWolf's wd-*-tagger-v3
repositories ship it)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError


@dataclass(frozen=True)
class CaptionerKind:
    name: str                 # `--arch caption-<name>`, `builtin:tiny-caption-<name>`
    label: str
    model_types: tuple[str, ...]  # config.json model_type values it reads ("" for the tagger)
    model_class: str          # the transformers class ("" for the tagger)
    processor_class: str      # the transformers processor class
    targets: tuple[str, ...]  # what it can write: "natural", "tags"
    example: str              # a real model a user would point --model at


KINDS: tuple[CaptionerKind, ...] = (
    CaptionerKind("florence2", "Florence-2 (small, fast, runs on a CPU)", ("florence2",),
                  "Florence2ForConditionalGeneration", "Florence2Processor", ("natural",),
                  "florence-community/Florence-2-base"),
    CaptionerKind("qwen2_5_vl", "Qwen2.5-VL", ("qwen2_5_vl",), "Qwen2_5_VLForConditionalGeneration",
                  "Qwen2_5_VLProcessor", ("natural", "tags"), "Qwen/Qwen2.5-VL-3B-Instruct"),
    CaptionerKind("qwen3_vl", "Qwen3-VL", ("qwen3_vl",), "Qwen3VLForConditionalGeneration", "Qwen3VLProcessor",
                  ("natural", "tags"), "Qwen/Qwen3-VL-4B-Instruct"),
    CaptionerKind("joycaption", "JoyCaption (LLaVA)", ("llava",), "LlavaForConditionalGeneration", "LlavaProcessor",
                  ("natural", "tags"), "fancyfeast/llama-joycaption-beta-one-hf-llava"),
    CaptionerKind("wd14", "WD14-style tagger (ONNX)", (), "", "", ("tags",), "SmilingWolf/wd-vit-tagger-v3"),
    # any other model transformers reads as image-text-to-text (SmolVLM, Gemma 3, InternVL, …): the
    # processor class named in its folder, the chat template it ships; its tiny model is a Qwen2-VL
    CaptionerKind("vlm", "another vision-language model (AutoModelForImageTextToText)", (),
                  "AutoModelForImageTextToText", "", ("natural", "tags"), "HuggingFaceTB/SmolVLM-256M-Instruct"),
)
KIND_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
TINY_ARCHS: tuple[str, ...] = tuple(f"caption-{k.name}" for k in KINDS)   # make-tiny-model --arch
TAGGER_FILES = ("model.onnx", "selected_tags.csv")


def kind_named(name: str) -> CaptionerKind:
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise ConfigError(f"unknown captioner {name!r} (choose {', '.join(KIND_NAMES)})")


def detect_kind(folder: Path) -> CaptionerKind:
    """The captioner kind of a model folder; ConfigError naming --model when it is none of them."""
    folder = Path(folder)
    if all((folder / f).is_file() for f in TAGGER_FILES):
        return kind_named("wd14")
    config = folder / "config.json"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type", "")
    except FileNotFoundError:
        raise ConfigError(f"--model: {folder} has no config.json (a transformers model) and no "
                          f"{' + '.join(TAGGER_FILES)} (a WD14-style tagger)") from None
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"--model: {config} cannot be read ({e})") from None
    for kind in KINDS:
        if model_type in kind.model_types:
            return kind
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return kind_named("vlm")
    known = ", ".join(t for k in KINDS for t in k.model_types)
    raise ConfigError(f"--model: {folder} is a {model_type!r} model, which transformers does not read as an "
                      f"image-text-to-text model; the captioners read {known}, the other vision-language models "
                      f"and WD14-style ONNX taggers")
