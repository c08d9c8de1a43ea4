"""Qwen-Image 2.1's text conditioning, as QwenImage21Pipeline computes it: the caption (after the
control images' vision tokens for an edit pair) inside the pipeline's own template string, through
Qwen3-VL, the last decoder layer's output BEFORE the final norm (the pipeline hooks the norm away),
the valid tokens with the system prompt's tokens dropped, padded again with a mask, plus the mask of
the vision-token positions the transformer fills with the control image's latents.

The templates and the dropped-token count are read from a pipeline built over the model's own
processor, so training sees what sampling sees. The processor (image processor + tokenizer) is
built, saved and loaded here without torchvision (transformers 5 cannot construct a Qwen3VLProcessor
without its video processor, which needs torchvision: FIELD-NOTES.md).
"""
from __future__ import annotations

import json
from pathlib import Path

PROCESSOR_CLASS = "Qwen3VLProcessor"
# what Qwen3-VL's chat template renders for the messages the pipeline tokenizes (a system text, user
# texts and images): the tiny models' processor carries it; a real folder's chat_template wins
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
                 "{% else %}{% for c in m.content %}{% if c.type == 'text' %}{{ c.text }}{% else %}"
                 "<|vision_start|><|image_pad|><|vision_end|>{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def assemble_processor(image_processor, tokenizer, chat_template: str | None = None):
    """A Qwen3VLProcessor over these two parts (no video processor: images only)."""
    from transformers import Qwen3VLProcessor
    p = Qwen3VLProcessor.__new__(Qwen3VLProcessor)
    p.chat_template = chat_template or CHAT_TEMPLATE
    p.image_processor, p.tokenizer, p.video_processor = image_processor, tokenizer, None
    for name, token in (("image", "<|image_pad|>"), ("video", "<|video_pad|>"),
                        ("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>")):
        setattr(p, f"{name}_token", token)
        setattr(p, f"{name}_token_id", tokenizer.convert_tokens_to_ids(token))
    return p


def build_processor(tokenizer, min_pixels: int, max_pixels: int):
    from ..qwen_image.text import _image_processor_class
    # Qwen3-VL: 16-px patches merged 2×2, so one vision token per 32×32 pixels (2×2 latents of the 16× VAE)
    image_processor = _image_processor_class()(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=16,
                                               merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                                               image_std=[0.5] * 3)
    return assemble_processor(image_processor, tokenizer)


def save_processor(processor, folder: Path, model_index: Path | None = None) -> None:
    """The processor/ folder (tokenizer, preprocessor and chat template); model_index.json names it."""
    from ..qwen_image.text import IMAGE_PROCESSOR_TYPE
    folder.mkdir(parents=True, exist_ok=True)
    processor.tokenizer.save_pretrained(str(folder))
    processor.image_processor.save_pretrained(str(folder))
    config_file = folder / "preprocessor_config.json"
    config = json.loads(config_file.read_text())
    config.update(image_processor_type=IMAGE_PROCESSOR_TYPE, processor_class=PROCESSOR_CLASS)
    config_file.write_text(json.dumps(config, indent=2))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": processor.chat_template}, indent=2))
    if model_index is not None:
        index = json.loads(model_index.read_text())
        index["processor"] = ["transformers", PROCESSOR_CLASS]
        model_index.write_text(json.dumps(index, indent=2, sort_keys=True))


def load_processor(folder: Path):
    """A Qwen-Image 2.1 folder's processor/, offline, without torchvision."""
    from transformers import AutoTokenizer
    from ..qwen_image.text import _image_processor_class
    image_processor = _image_processor_class().from_pretrained(str(folder), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    template_file = folder / "chat_template.json"
    template = json.loads(template_file.read_text()).get("chat_template") if template_file.is_file() else None
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    return assemble_processor(image_processor, tokenizer, template)


def pipeline_text(processor) -> tuple[str, str, int, int]:
    """(text-to-image template, image-conditioned template, system tokens dropped, image-pad token id),
    from the installed QwenImage21Pipeline built over this processor."""
    from diffusers import QwenImage21Pipeline
    pipe = QwenImage21Pipeline(scheduler=None, vae=None, text_encoder=None, processor=processor, transformer=None)
    return pipe.prompt_template_t2i, pipe.prompt_template_ti2i, pipe._drop_idx, pipe._img_token_id


def tokenize(processor, captions: list[str], images: list | None = None) -> list:
    """[input_ids, attention_mask] (+ [pixel_values, image_grid_thw, mm_token_type_ids] with one control image
    per caption),
    left-padded as the pipeline pads."""
    t2i, ti2i, _, _ = pipeline_text(processor)
    captions = [c or " " for c in captions]  # the pipeline's stand-in for an empty caption
    if images is None:
        enc = processor(text=[t2i.format(c) for c in captions], padding=True, padding_side="left",
                        return_tensors="pt")
        return [enc["input_ids"], enc["attention_mask"]]
    enc = processor(text=[ti2i.format(c) for c in captions], images=list(images), padding=True, padding_side="left",
                    return_tensors="pt")
    return [enc["input_ids"], enc["attention_mask"], enc["pixel_values"], enc["image_grid_thw"],
            enc["mm_token_type_ids"]]


def encode(text_encoder, processor, inputs: list, length: int | None) -> dict:
    """{"hidden": [B, L, D], "mask": [B, L], "image_slots": [B, L] bool}: the pipeline's prompt_embeds,
    their mask and image_pad_mask, padded (or cut) to `length` (None: the longest in the batch)."""
    import torch
    _, _, drop, image_token = pipeline_text(processor)
    ids, mask = inputs[0], inputs[1]
    extra = dict(zip(("pixel_values", "image_grid_thw", "mm_token_type_ids"), inputs[2:]))
    encoder = getattr(text_encoder, "module", text_encoder)  # DDP
    inner = encoder.model
    text_model = getattr(inner, "language_model", inner)
    # the last decoder layer's output before the final RMSNorm, as the pipeline reads it
    handle = text_model.norm.register_forward_hook(lambda module, args, output: args[0])
    try:
        hidden = inner(input_ids=ids, attention_mask=mask, output_hidden_states=True, **extra).hidden_states[-1]
    finally:
        handle.remove()
    valid = [h[m.bool()][drop:] for h, m in zip(hidden, mask)]
    slots = [(i[m.bool()] == image_token)[drop:] for i, m in zip(ids, mask)]
    if length is not None:
        valid, slots = [v[:length] for v in valid], [s[:length] for s in slots]
    width = length if length is not None else max(v.shape[0] for v in valid)
    out = hidden.new_zeros(len(valid), width, hidden.shape[-1])
    out_mask = torch.zeros(len(valid), width, dtype=torch.long, device=hidden.device)
    out_slots = torch.zeros(len(valid), width, dtype=torch.bool, device=hidden.device)
    for i, (v, s) in enumerate(zip(valid, slots)):
        out[i, :v.shape[0]], out_mask[i, :v.shape[0]], out_slots[i, :s.shape[0]] = v, 1, s
    return {"hidden": out, "mask": out_mask, "image_slots": out_slots}
