"""Tiny random captioners of every kind, built offline in a second or two for tests, the bench and
a first try of the page: the transformers classes with few-layer configs, the project's own
offline tokenizers (families/tiny_qwen.py's byte-level BPE, as Bart and Llama's also are) and
image processors that need no torchvision; the tagger as a small ONNX graph with its tag list.
Their text is gibberish (random weights); everything around it is real.

`make-tiny-model --arch caption-<kind>` writes one into a folder; `builtin:tiny-caption-<kind>` builds
it once into the studio's model cache (families/builtin.py's race-safe folder building)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from ..errors import ConfigError
from .kinds import KIND_NAMES

BUILTIN_PREFIX = "builtin:tiny-caption-"
DONE_MARKER = "tiny-captioner.json"
TINY_VERSION = 1
IMAGE_SIZE = 32   # pixels the tiny models see: a few vision tokens each

# Renders chat messages as Qwen's and most chat templates do; an {"type": "image"} part becomes the
# model's image placeholder (Qwen-VL: vision start, image pad, vision end; LLaVA: <image>).
_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- 'IMAGE' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"

# the tagger's tag list in selected_tags.csv's categories: 9 rating, 0 general, 4 character
TINY_TAGS = [("general", 9), ("sensitive", 9), ("questionable", 9), ("explicit", 9),
             ("1girl", 0), ("solo", 0), ("outdoors", 0), ("sky", 0), ("cat", 0), ("dog", 0), ("smile", 0),
             ("red_background", 0), ("simple_background", 0), ("no_humans", 0), ("^_^", 0), ("hatsune_miku", 4)]


def build_tiny_captioner(kind: str, out: str | Path, seed: int = 0) -> Path:
    """Write the tiny `kind` captioner into `out` (created); returns the folder."""
    builders = {"florence2": _florence2, "qwen2_5_vl": lambda o, s: _qwen_vl(o, s, "qwen2_5_vl"),
                "qwen3_vl": lambda o, s: _qwen_vl(o, s, "qwen3_vl"), "joycaption": _llava, "wd14": _tagger,
                "vlm": lambda o, s: _qwen_vl(o, s, "qwen2_vl")}
    if kind not in builders:
        raise ConfigError(f"--arch: unknown captioner caption-{kind} (choose caption-{', caption-'.join(KIND_NAMES)})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    builders[kind](out, seed)
    (out / DONE_MARKER).write_text(json.dumps({"kind": kind, "seed": seed, "version": TINY_VERSION}))
    return out


def resolve_builtin(spec: str) -> Path | None:
    """`builtin:tiny-caption-<kind>` -> its cached folder (built on first use); None for other specs."""
    if not spec.startswith(BUILTIN_PREFIX):
        return None
    kind = spec[len(BUILTIN_PREFIX):]
    if kind not in KIND_NAMES:
        raise ConfigError(f"--model: unknown builtin captioner {spec!r} (choose "
                          f"{', '.join(BUILTIN_PREFIX + k for k in KIND_NAMES)})")
    from ..families.builtin import atomic_dir, cache_root
    final = cache_root() / f"tiny-caption-{kind}-v{TINY_VERSION}"
    return atomic_dir(final, lambda tmp: build_tiny_captioner(kind, tmp), DONE_MARKER)


def _seeded(seed: int):
    import torch
    torch.manual_seed(seed)


def _tokenizer(out: Path, extra_tokens: tuple[str, ...] = ()):
    from transformers import AutoTokenizer
    from ..families.tiny_qwen import build_qwen_tokenizer
    build_qwen_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    if extra_tokens:
        tokenizer.add_tokens(list(extra_tokens), special_tokens=True)
    return tokenizer


def _qwen_vl(out: Path, seed: int, kind: str) -> None:
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration, Qwen3VLConfig, Qwen3VLForConditionalGeneration)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from ..families.tiny_qwen import ENDOFTEXT, IM_END, qwen_vocab_size, special_token_id
    from .vlm import images_only_processor_class
    tokenizer = _tokenizer(out)
    ids = dict(image_token_id=special_token_id("<|image_pad|>"), video_token_id=special_token_id("<|video_pad|>"),
               vision_start_token_id=special_token_id("<|vision_start|>"),
               vision_end_token_id=special_token_id("<|vision_end|>"))
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                vocab_size=qwen_vocab_size(), max_position_embeddings=2048, rms_norm_eps=1e-6, bos_token_id=None,
                eos_token_id=special_token_id(IM_END), pad_token_id=special_token_id(ENDOFTEXT))
    _seeded(seed)
    if kind == "qwen2_vl":   # the generic kind's tiny model: a model type no named kind claims
        patch = 14
        text.update(rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [2, 3, 3]},
                    rope_theta=1e6)
        vision = dict(depth=1, embed_dim=16, hidden_size=32, mlp_ratio=2, num_heads=2, patch_size=patch,
                      spatial_merge_size=2, temporal_patch_size=2)
        model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(
            text_config=text, vision_config=vision, vocab_size=qwen_vocab_size(), tie_word_embeddings=False, **ids))
        processor_class = "Qwen2VLProcessor"
    elif kind == "qwen2_5_vl":
        patch = 14
        text.update(rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [2, 3, 3]},
                    rope_theta=1e6)
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=patch,
                      spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[0])
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
            text_config=text, vision_config=vision, vocab_size=qwen_vocab_size(), tie_word_embeddings=False, **ids))
        processor_class = "Qwen2_5_VLProcessor"
    else:
        patch = 16
        text.update(head_dim=16, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                                  "rope_theta": 1e6, "mrope_interleaved": True})
        vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=patch,
                      spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                      deepstack_visual_indexes=[1])
        model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision,
                                                              tie_word_embeddings=False, **ids))
        processor_class = "Qwen3VLProcessor"
    model.eval().save_pretrained(str(out))
    side = 2 * patch   # one merged vision token per 2×2 patches: 1 to 4 tokens per image
    image_processor = Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side * 4, patch_size=patch,
                                               merge_size=2, temporal_patch_size=2)
    processor = images_only_processor_class(processor_class)(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
        chat_template=_CHAT_TEMPLATE.replace("IMAGE", QWEN_IMAGE))
    processor.save_pretrained(str(out))


def _llava(out: Path, seed: int) -> None:
    """JoyCaption's shape: LLaVA over a SigLIP vision tower (its full features, no CLS) and a Llama."""
    from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor, SiglipVisionConfig
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    from ..families.tiny_qwen import ENDOFTEXT, IM_END, special_token_id
    tokenizer = _tokenizer(out, ("<image>",))
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                image_size=IMAGE_SIZE, patch_size=8)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024, bos_token_id=None,
                       eos_token_id=special_token_id(IM_END), pad_token_id=special_token_id(ENDOFTEXT))
    config = LlavaConfig(vision_config=vision.to_dict(), text_config=text.to_dict(),
                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-2,
                         vision_feature_select_strategy="full", projector_hidden_act="gelu")
    _seeded(seed)
    LlavaForConditionalGeneration(config).eval().save_pretrained(str(out))
    processor = LlavaProcessor(image_processor=SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
                               tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="full",
                               chat_template=_CHAT_TEMPLATE.replace("IMAGE", "<image>"))
    processor.save_pretrained(str(out))


def _florence2(out: Path, seed: int) -> None:
    """A DaViT vision tower of four one-block stages and a one-layer Bart, with Bart's byte-level BPE."""
    from transformers import (BartConfig, BartTokenizer, CLIPImageProcessor, Florence2Config,
                              Florence2ForConditionalGeneration, Florence2Processor)
    from ..families.tiny_qwen import byte_level_vocab_and_merges
    vocab, merges = byte_level_vocab_and_merges()
    ids = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>"])}
    for token in [*vocab, "<mask>", "<image>"]:
        ids.setdefault(token, len(ids))
    (out / "vocab.json").write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n",
                                    encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BartTokenizer", "model_max_length": 1024, "extra_special_tokens": {"image_token": "<image>"}}))
    tokenizer = BartTokenizer.from_pretrained(str(out))
    text = BartConfig(vocab_size=len(tokenizer), d_model=32, encoder_layers=1, decoder_layers=1,
                      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                      max_position_embeddings=256, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                      decoder_start_token_id=2, forced_eos_token_id=2)
    vision = dict(depths=[1, 1, 1, 1], embed_dim=[8, 16, 16, 32], num_heads=[1, 1, 1, 1], num_groups=[1, 1, 1, 1],
                  window_size=2, projection_dim=32, drop_path_rate=0.0)
    _seeded(seed)
    model = Florence2ForConditionalGeneration(Florence2Config(text_config=text.to_dict(), vision_config=vision,
                                                              image_token_id=tokenizer.image_token_id))
    model.eval().save_pretrained(str(out))
    # the vision tower downsamples 32×: a 64 px image is 2×2 features plus the pooled one
    side = 64
    image_processor = CLIPImageProcessor(size={"height": side, "width": side}, do_center_crop=False)
    image_processor.image_seq_length = (side // 32) ** 2 + 1
    Florence2Processor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(str(out))


def _tagger(out: Path, seed: int) -> None:
    """wd-*-tagger-v3's interface on a tiny graph: NHWC BGR 0-255 input, per-tag sigmoid output
    (mean colour → linear → sigmoid), and selected_tags.csv."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    n = len(TINY_TAGS)
    weight = numpy_helper.from_array((rng.standard_normal((3, n)) * 0.02).astype(np.float32), "weight")
    bias = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")
    nodes = [helper.make_node("ReduceMean", ["input"], ["mean"], axes=[1, 2], keepdims=0),
             helper.make_node("MatMul", ["mean", "weight"], ["logits0"]),
             helper.make_node("Add", ["logits0", "bias"], ["logits"]),
             helper.make_node("Sigmoid", ["logits"], ["output"])]
    graph = helper.make_graph(
        nodes, "tiny-tagger",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", IMAGE_SIZE, IMAGE_SIZE, 3])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", n])], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(out / "model.onnx"))
    with open(out / "selected_tags.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["tag_id", "name", "category", "count"])
        for i, (name, category) in enumerate(TINY_TAGS):
            writer.writerow([i, name, category, 1000 - i])
