"""Vision-language captioners through transformers' own classes (Florence-2, Qwen2.5-VL, Qwen3-VL,
JoyCaption's LLaVA, and any other image-text-to-text model through AutoModelForImageTextToText): the
model and its processor loaded from a folder, batches of images in,
one caption per image out; bf16 on a GPU (fp32 on a CPU, where bf16 is emulated and slower),
optionally 8-bit or 4-bit weights through bitsandbytes to fit small cards.

The processors are loaded for images only: transformers 5 cannot build a Qwen-VL processor without
its video processor, which needs torchvision (FIELD-NOTES.md); a subclass that declares no video
processor loads the same files and processes images exactly as the original."""
from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

from ..errors import ConfigError
from .kinds import CaptionerKind

LOG = logging.getLogger("trainer")
# JoyCaption's model card: the system prompt it was trained with
JOYCAPTION_SYSTEM = "You are a helpful image captioner."


@lru_cache(maxsize=None)
def images_only_processor_class(name: str):
    """transformers' processor class `name` without its video processor (images are all a captioner
    passes); it reads and writes the same folder layout."""
    import transformers
    base = getattr(transformers, name)

    class ImagesOnly(base):
        @classmethod
        def get_attributes(cls):
            return [a for a in super().get_attributes() if a != "video_processor"]

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = name   # saved folders name the real class
    return ImagesOnly


def folder_processor_class(folder: Path) -> str:
    """The processor class a model folder names (processor_config.json, else preprocessor_config.json)."""
    import json
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        try:
            found = json.loads((Path(folder) / name).read_text(encoding="utf-8")).get("processor_class", "")
        except (OSError, ValueError, AttributeError):
            continue
        if found:
            return found
    return ""


def load_processor(folder: Path, class_name: str = ""):
    """The folder's processor for images: the named transformers class without its video processor;
    AutoProcessor when the folder names no class transformers has."""
    import transformers
    name = class_name or folder_processor_class(folder)
    if name and hasattr(transformers, name):
        return images_only_processor_class(name).from_pretrained(str(folder), local_files_only=True)
    return transformers.AutoProcessor.from_pretrained(str(folder), local_files_only=True)


def pick_device(device: str) -> str:
    from ..compute.devices import as_device, cuda_available, is_cuda
    if device == "auto":
        return str(as_device(None))  # the current accelerator, else the CPU
    if is_cuda(device) and not cuda_available():
        raise ConfigError(f"--device: {device} asked for, but torch sees no CUDA GPU here")
    return device


def pick_dtype(dtype: str, device: str):
    import torch
    from ..compute.devices import is_cuda
    if dtype == "auto":
        return torch.bfloat16 if is_cuda(device) else torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]


def quantization_config(quantize: str, dtype, device: str):
    """bitsandbytes' config for --quantize 8bit/4bit (nf4, computing in `dtype`); None for none."""
    if quantize == "none":
        return None
    from ..compute.devices import is_cuda
    if not is_cuda(device):
        raise ConfigError(f"--quantize {quantize}: bitsandbytes' quantized weights need a CUDA GPU; "
                          "on a CPU use --quantize none")
    from transformers import BitsAndBytesConfig
    if quantize == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
                              bnb_4bit_use_double_quant=True)


class VisionLanguageCaptioner:
    def __init__(self, folder: Path, kind: CaptionerKind, device: str = "auto", dtype: str = "auto",
                 quantize: str = "none"):
        import transformers
        self.kind = kind
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        quant = quantization_config(quantize, self.dtype, self.device)
        model_class = getattr(transformers, kind.model_class)
        extra = {"quantization_config": quant, "device_map": {"": self.device}} if quant else {}
        self.model = model_class.from_pretrained(str(folder), dtype=self.dtype, local_files_only=True, **extra).eval()
        if not quant:
            self.model.to(self.device)
        self.processor = load_processor(folder, kind.processor_class)
        self.encoder_decoder = bool(getattr(self.model.config, "is_encoder_decoder", False))
        if not self.encoder_decoder:   # decoder-only models continue the prompt: pad on the left
            self.processor.tokenizer.padding_side = "left"

    def _prompt_text(self, instruction: str) -> str:
        if self.kind.name == "florence2":
            return instruction
        image_token = getattr(self.processor, "image_token", "<image>")
        if self.kind.name == "joycaption":   # its template takes plain-text messages (model card)
            messages = [{"role": "system", "content": JOYCAPTION_SYSTEM}, {"role": "user", "content": instruction}]
        else:
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}]
        if not getattr(self.processor, "chat_template", None):   # a model without a chat template: plain text
            return image_token + instruction
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if image_token not in text:   # a template that places no image: the image before the instruction
            text = text.replace(instruction, image_token + instruction, 1)
        return text

    def caption(self, images: list, instruction: str, max_new_tokens: int) -> list[str]:
        import torch
        text = self._prompt_text(instruction)
        inputs = self.processor(text=[text] * len(images), images=images, padding=True, return_tensors="pt")
        inputs = {k: (v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device))
                  for k, v in inputs.items() if hasattr(v, "to")}
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
        if not self.encoder_decoder:
            out = out[:, inputs["input_ids"].shape[1]:]
        return [t.strip() for t in self.processor.batch_decode(out, skip_special_tokens=True)]
