"""LTX-2 LoRA targets and files in ComfyUI's layout (Lightricks' own trainer's): `diffusion_model.<module>
.lora_A/.lora_B.weight` with LTX-2's original names, which for the blocks' linears are diffusers' (`transformer_blocks.<i>.attn1.to_q`);
diffusers' converter (`_convert_non_diffusers_ltx2_lora_to_diffusers`) reads them back.

A video-only LoRA adapts the video stream (self- and cross-attention, feed-forward); with an audio track
the audio stream and the audio<->video cross-attentions are adapted too."""
from __future__ import annotations

from typing import Callable

_LINEARS = r"(?:to_q|to_k|to_v|to_out\.0)"
VIDEO_TARGETS = rf"transformer_blocks\.\d+\.(?:(?:attn1|attn2)\.{_LINEARS}|ff\.net\.(?:0\.proj|2))"
AUDIO_TARGETS = (rf"transformer_blocks\.\d+\.(?:(?:audio_attn1|audio_attn2|audio_to_video_attn|video_to_audio_attn)"
                 rf"\.{_LINEARS}|audio_ff\.net\.(?:0\.proj|2))")
# what diffusers renamed from the original checkpoint (the blocks' linears keep their names)
_ORIGINAL = {"proj_in": "patchify_proj", "audio_proj_in": "audio_patchify_proj"}


def targets(audio: bool) -> str:
    """peft `target_modules` (a full-match regex) for a video-only or an audio+video LoRA."""
    return f"(?:{VIDEO_TARGETS}|{AUDIO_TARGETS})" if audio else VIDEO_TARGETS


def original_name(module: str) -> str:
    head, _, rest = module.partition(".")
    return ".".join(filter(None, (_ORIGINAL.get(head, head), rest)))


def to_comfy_lora(adapter_states: dict[str, dict], alpha: float | Callable[[str, str], float]) -> dict:
    """peft adapter weights of the LTX-2 transformer -> one ComfyUI-layout state dict:
    `diffusion_model.<module>.lora_A.weight` / `.lora_B.weight`, as Lightricks' trainer writes them. No
    `.alpha` keys (diffusers' LTX-2 loader refuses them; ComfyUI then takes alpha = rank), so alpha/rank is
    folded into lora_B."""
    out: dict = {}
    for component, sd in adapter_states.items():
        if component != "transformer":
            raise ValueError(f"LTX-2 LoRA files hold transformer adapters only, not {component!r}")
        for key, tensor in sd.items():
            if not key.endswith(("lora_A.weight", "lora_B.weight")):
                raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
            module, kind = key.rsplit(".lora_", 1)
            name = f"diffusion_model.{original_name(module)}.lora_{kind}"
            if kind == "A.weight":
                out[name] = tensor.contiguous()
            else:
                rank = sd[f"{module}.lora_A.weight"].shape[0]
                value = alpha(component, module) if callable(alpha) else alpha
                out[name] = (tensor * (float(value) / rank)).contiguous()
    return out


def meta_transformer():
    """The full-size LTX-2 transformer (diffusers' LTX2VideoTransformer3DModel defaults: 48 blocks, 4096-wide
    video stream, 2048-wide audio stream) on the meta device."""
    import torch
    from diffusers import LTX2VideoTransformer3DModel
    with torch.device("meta"):
        return LTX2VideoTransformer3DModel()
