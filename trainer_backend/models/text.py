"""The text side of training: captions -> token ids -> UNet conditioning.

These compute exactly what diffusers' pipelines compute in `encode_prompt`, so a model is
trained on the same conditioning it is sampled with (the tests compare the two).
"""
from __future__ import annotations

import torch

from .loader import LoadedModel


def tokenize(model: LoadedModel, captions: list[str]) -> list[torch.Tensor]:
    """One (batch, model_max_length) input_ids tensor per tokenizer, padded and truncated."""
    return [tok(list(captions), padding="max_length", max_length=tok.model_max_length, truncation=True,
                return_tensors="pt").input_ids
            for tok in model.tokenizers]


def encode_text(model: LoadedModel, input_ids: list[torch.Tensor],
                encoders: list | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(encoder_hidden_states, pooled).

    sd1/sd2: the encoder's last hidden state (after its final layer norm; SD2's encoder already
    ends one layer early), pooled None. sdxl: the penultimate hidden states of both encoders
    concatenated on the feature axis; pooled = encoder 2's projected text embedding.
    Gradients flow through any trainable parameters (e.g. text-encoder LoRA).
    `encoders` replaces model.text_encoders, e.g. with DDP-wrapped ones whose forward syncs
    gradients across processes.
    """
    encoders = encoders or model.text_encoders
    if model.arch != "sdxl":
        encoder = encoders[0]
        return encoder(input_ids[0].to(_device(encoder)))[0], None
    states, pooled = [], None
    for encoder, ids in zip(encoders, input_ids):
        out = encoder(ids.to(_device(encoder)), output_hidden_states=True)
        if out[0].ndim == 2:  # CLIPTextModelWithProjection: text_embeds
            pooled = out[0]
        states.append(out.hidden_states[-2])
    return torch.cat(states, dim=-1), pooled


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def sdxl_add_time_ids(original_size: tuple[int, int], crop_top_left: tuple[int, int],
                      target_size: tuple[int, int]) -> torch.Tensor:
    """SDXL's micro-conditioning for one image: (6,) = original (h, w), crop (top, left), target (h, w)."""
    return torch.tensor([*original_size, *crop_top_left, *target_size], dtype=torch.float32)
