"""Krea 2's text conditioning of an edit pair, as the community's Krea 2 edit LoRA was trained (ai-toolkit's
Krea 2 `edit` mode; its ComfyUI nodes encode the same way): Qwen3-VL reads the reference images before the
instruction, `Picture 1: <|vision_start|><|image_pad|><|vision_end|>` per reference (the layout of ComfyUI's
TextEncodeQwenImageEditPlus), each reference downscaled to about 384² pixels (the encoder only needs the
gist; the detail reaches the transformer through the reference tokens), between Krea2Pipeline's own
prefix and suffix. Each sequence keeps its natural length (right padding, masked; Qwen3-VL places the
vision tokens with its own multimodal rotary positions), the same layers are tapped and stacked per token
and the prefix's tokens dropped, as for a caption alone (family.py). Used by training (family.py) and by
Krea2EditPipeline (pipeline.py), so samples see what training saw."""
from __future__ import annotations

from functools import lru_cache

VL_MAX_PIXELS = 384 * 384  # a reference's area as Qwen3-VL reads it (ai-toolkit's vlm_max_pixels)
PICTURE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"


@lru_cache(maxsize=4)
def processor_for(tokenizer):
    """A Qwen3-VL processor (images only) over Krea 2's own tokenizer: 16-px patches merged 2×2, mean and std
    0.5, Qwen3-VL's image processing (built here: no torchvision, qwen_image21/text.py)."""
    from ..qwen_image21.text import build_processor
    return build_processor(tokenizer, min_pixels=32 * 32, max_pixels=2 * VL_MAX_PIXELS)


def vl_image(image):
    """A reference as Qwen3-VL reads it: RGB, scaled down (never up) to at most VL_MAX_PIXELS, aspect kept."""
    from PIL import Image
    image = image.convert("RGB")
    scale = min(1.0, (VL_MAX_PIXELS / (image.width * image.height)) ** 0.5)
    size = (max(32, round(image.width * scale)), max(32, round(image.height * scale)))
    return image if size == image.size else image.resize(size, Image.BICUBIC)


def tokenize(tokenizer, captions: list[str], references: list[list], template: tuple[str, str, int, int]) -> list:
    """[input_ids, attention_mask, pixel_values, image_grid_thw, mm_token_type_ids]: per caption
    prefix + "Picture 1: <vision>…" + caption + suffix, right-padded; references: per caption its PIL images."""
    import torch
    prefix, suffix, _, _ = template
    processor = processor_for(tokenizer)
    tail = tokenizer([suffix], return_tensors="pt").input_ids[0]
    rows, pixels, grids = [], [], []
    for caption, images in zip(captions, references):
        text = prefix + "".join(PICTURE.format(i + 1) for i in range(len(images))) + caption
        enc = processor(text=[text], images=[vl_image(i) for i in images], return_tensors="pt")
        types = enc["mm_token_type_ids"][0]
        rows.append((torch.cat([enc["input_ids"][0], tail]), torch.cat([types, torch.zeros_like(tail).to(types)])))
        pixels.append(enc["pixel_values"])
        grids.append(enc["image_grid_thw"])
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id or 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    types = torch.zeros(len(rows), width, dtype=rows[0][1].dtype)
    for i, (row, kind) in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)], types[i, :len(row)] = row, 1, kind
    return [ids, mask, torch.cat(pixels), torch.cat(grids), types]


def encode(encoder, inputs: list, layers: tuple[int, ...], start: int) -> dict:
    """{"hidden": [B, L, len(layers), D], "mask": [B, L]}: the tapped layers of Qwen3-VL (a Qwen3VLModel) over
    tokenize's inputs, the prefix's `start` tokens dropped."""
    import torch
    encoder = getattr(encoder, "module", encoder)  # DDP
    device = next(encoder.parameters()).device
    ids, mask, pixel_values, grid, types = (t.to(device) for t in inputs)
    out = encoder(input_ids=ids, attention_mask=mask, pixel_values=pixel_values.to(encoder.dtype),
                  image_grid_thw=grid, mm_token_type_ids=types, output_hidden_states=True)
    hidden = torch.stack([out.hidden_states[i] for i in layers], dim=2)
    return {"hidden": hidden[:, start:], "mask": mask[:, start:]}
