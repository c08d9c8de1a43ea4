"""Qwen-Image's text conditioning, as its diffusers pipelines compute it: the caption inside the
pipeline's chat template, through Qwen2.5-VL, the last hidden layer's valid (unpadded) tokens with
the template's first tokens dropped, padded again with a mask. Qwen-Image-Edit's template holds the
control image too: the vision-language processor turns it into vision tokens the encoder reads
before the instruction.

The templates and the number of dropped tokens are read from the installed pipelines, so training
sees exactly what sampling sees. The processor (image processor + tokenizer) is built and loaded
here without torchvision: transformers 5 cannot construct a Qwen2VLProcessor without its video
processor, which needs torchvision (FIELD-NOTES.md); the edit model only ever passes images.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

IMAGE_PROCESSOR_TYPE = "Qwen2VLImageProcessor"


@lru_cache(maxsize=2)
def prompt_template(edit: bool) -> tuple[str, int]:
    """(template with one {} for the caption, leading tokens dropped) of the installed pipeline."""
    from diffusers import QwenImageEditPipeline, QwenImagePipeline
    parts = dict(scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=None)
    pipe = QwenImageEditPipeline(processor=None, **parts) if edit else QwenImagePipeline(**parts)
    return pipe.prompt_template_encode, pipe.prompt_template_encode_start_idx


# QwenImageEditPlusPipeline's announcement of each reference image (a local string in its
# _get_qwen_prompt_embeds, not an attribute to read): "Picture 1: <vision tokens>Picture 2: …" + instruction
PICTURE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"


@lru_cache(maxsize=1)
def plus_template() -> tuple[str, int]:
    """(template, leading tokens dropped) of the installed QwenImageEditPlusPipeline."""
    from diffusers import QwenImageEditPlusPipeline
    pipe = QwenImageEditPlusPipeline(processor=None, scheduler=None, vae=None, text_encoder=None, tokenizer=None,
                                     transformer=None)
    return pipe.prompt_template_encode, pipe.prompt_template_encode_start_idx


def condition_image(image):
    """A reference image as QwenImageEditPlusPipeline hands it to the vision-language encoder: resized
    to about 384² pixels at its own aspect (sides multiples of 32)."""
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import CONDITION_IMAGE_SIZE, calculate_dimensions
    width, height = calculate_dimensions(CONDITION_IMAGE_SIZE, image.width / image.height)
    return VaeImageProcessor(vae_scale_factor=16).resize(image, height, width)


def tokenize_plus(processor, captions: list[str], references: list[list]) -> list:
    """The Edit-Plus text-encoder inputs: each caption after its own references' "Picture N:" vision tokens;
    references[i] are caption i's PIL images (one to three)."""
    template, _ = plus_template()
    texts = [template.format("".join(PICTURE.format(n + 1) for n in range(len(refs))) + caption)
             for caption, refs in zip(captions, references)]
    images = [condition_image(img) for refs in references for img in refs]  # in the order of their tokens
    enc = processor(text=texts, images=images, padding=True, return_tensors="pt")
    return [enc["input_ids"], enc["attention_mask"], enc["pixel_values"], enc["image_grid_thw"]]


def _image_processor_class():
    try:  # the PIL implementation (what Qwen2VLImageProcessor falls back to without torchvision)
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
        return Qwen2VLImageProcessorPil
    except ImportError:
        from transformers import Qwen2VLImageProcessor
        return Qwen2VLImageProcessor


def assemble_processor(image_processor, tokenizer):
    """A Qwen2VLProcessor over these two parts (no video processor: images only)."""
    from transformers import Qwen2VLProcessor
    processor = Qwen2VLProcessor.__new__(Qwen2VLProcessor)
    processor.chat_template, processor.image_processor, processor.tokenizer = None, image_processor, tokenizer
    processor.video_processor = None
    processor.image_token, processor.video_token = "<|image_pad|>", "<|video_pad|>"
    processor.image_token_id = tokenizer.convert_tokens_to_ids(processor.image_token)
    processor.video_token_id = tokenizer.convert_tokens_to_ids(processor.video_token)
    return processor


def build_processor(tokenizer, min_pixels: int, max_pixels: int):
    image_processor = _image_processor_class()(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14,
                                               merge_size=2, temporal_patch_size=2)
    return assemble_processor(image_processor, tokenizer)


def save_processor(processor, folder: Path, model_index: Path | None = None) -> None:
    """The processor/ folder in the layout Qwen-Image-Edit ships (Qwen2VLProcessor.from_pretrained
    reads it where torchvision is installed); model_index.json names it."""
    folder.mkdir(parents=True, exist_ok=True)
    processor.tokenizer.save_pretrained(str(folder))
    ip = processor.image_processor
    ip.save_pretrained(str(folder))
    config_file = folder / "preprocessor_config.json"
    config = json.loads(config_file.read_text())
    config.update(image_processor_type=IMAGE_PROCESSOR_TYPE, processor_class="Qwen2VLProcessor")
    config_file.write_text(json.dumps(config, indent=2))
    video = {k: config[k] for k in ("patch_size", "merge_size", "temporal_patch_size", "size", "image_mean",
                                    "image_std", "do_rescale", "rescale_factor", "do_normalize", "do_resize")
             if k in config}
    (folder / "video_preprocessor_config.json").write_text(json.dumps(
        {**video, "video_processor_type": "Qwen2VLVideoProcessor", "processor_class": "Qwen2VLProcessor"}, indent=2))
    if model_index is not None:
        index = json.loads(model_index.read_text())
        index["processor"] = ["transformers", "Qwen2VLProcessor"]
        model_index.write_text(json.dumps(index, indent=2, sort_keys=True))


def load_processor(folder: Path):
    """The processor/ folder of a Qwen-Image-Edit pipeline, offline, with or without torchvision."""
    from transformers import AutoTokenizer
    from transformers.utils import is_torchvision_available
    if is_torchvision_available():
        from transformers import Qwen2VLProcessor
        return Qwen2VLProcessor.from_pretrained(str(folder), local_files_only=True)
    image_processor = _image_processor_class().from_pretrained(str(folder), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return assemble_processor(image_processor, tokenizer)


def to_pil(pixels):
    """[-1, 1] image tensors [B, 3, H, W] -> RGB PIL images (what the pipeline hands the processor)."""
    from PIL import Image
    arr = ((pixels.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(dtype=__import__("torch").uint8)
    return [Image.fromarray(a.permute(1, 2, 0).numpy()) for a in arr]


def tokenize(tokenizer_or_processor, captions: list[str], edit: bool, images=None) -> list:
    """[input_ids, attention_mask] (+ [pixel_values, image_grid_thw] for the edit model's images)."""
    template, drop = prompt_template(edit)
    texts = [template.format(c) for c in captions]
    if edit:
        enc = tokenizer_or_processor(text=texts, images=images, padding=True, return_tensors="pt")
        return [enc["input_ids"], enc["attention_mask"], enc["pixel_values"], enc["image_grid_thw"]]
    enc = tokenizer_or_processor(texts, max_length=1024 + drop, padding=True, truncation=True, return_tensors="pt")
    return [enc.input_ids, enc.attention_mask]


def encode(text_encoder, inputs: list, edit: bool, length: int | None, drop: int | None = None):
    """{"hidden": [B, L, D], "mask": [B, L]}: the valid tokens after the dropped template prefix (`drop`
    tokens; None: the Qwen-Image(-Edit) template's), cut to and padded to `length` (None: the longest in
    the batch, as the edit pipelines do)."""
    import torch
    if drop is None:
        _, drop = prompt_template(edit)
    ids, mask = inputs[0], inputs[1]
    extra = {"pixel_values": inputs[2], "image_grid_thw": inputs[3]} if len(inputs) > 2 else {}
    encoder = getattr(text_encoder, "module", text_encoder)  # DDP
    hidden = encoder.model(input_ids=ids, attention_mask=mask, **extra).last_hidden_state
    valid = [h[m.bool()][drop:] for h, m in zip(hidden, mask)]
    if length is not None:
        valid = [v[:length] for v in valid]
    width = length if length is not None else max(v.shape[0] for v in valid)
    out = hidden.new_zeros(len(valid), width, hidden.shape[-1])
    out_mask = torch.zeros(len(valid), width, dtype=torch.long, device=hidden.device)
    for i, v in enumerate(valid):
        out[i, :v.shape[0]] = v
        out_mask[i, :v.shape[0]] = 1
    return {"hidden": out, "mask": out_mask}
