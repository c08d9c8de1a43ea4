"""The text side of training: captions -> token ids -> UNet conditioning.

These compute exactly what diffusers' pipelines compute in `encode_prompt`, so a model is
trained on the same conditioning it is sampled with (the tests compare the two).
"""
from __future__ import annotations

import torch

from ..base import LoadedModel


CHUNK = 75  # caption tokens per CLIP window (77 with BOS and EOS)


def tokenize(model: LoadedModel, captions: list[str], max_token_length: int = CHUNK) -> list[torch.Tensor]:
    """One input_ids tensor per tokenizer: (batch, 77), padded and truncated; or, for
    max_token_length 150/225, (batch, chunks, 77): the caption cut into 75-token chunks, each
    in its own BOS … EOS window (a chunk past the caption's end is an empty prompt)."""
    if max_token_length <= CHUNK:
        return [tok(list(captions), padding="max_length", max_length=tok.model_max_length, truncation=True,
                    return_tensors="pt").input_ids
                for tok in model.tokenizers]
    return [_chunked(tok, captions, max_token_length // CHUNK) for tok in model.tokenizers]


def _chunked(tok, captions: list[str], chunks: int) -> torch.Tensor:
    ids = tok(list(captions), add_special_tokens=False, truncation=True, max_length=chunks * CHUNK).input_ids
    window = tok.model_max_length
    out = torch.full((len(captions), chunks, window), tok.pad_token_id, dtype=torch.long)
    for b, caption_ids in enumerate(ids):
        for c in range(chunks):
            part = [tok.bos_token_id, *caption_ids[c * CHUNK:(c + 1) * CHUNK], tok.eos_token_id]
            out[b, c, :len(part)] = torch.tensor(part)
    return out


def encode_text(model: LoadedModel, input_ids: list[torch.Tensor],
                encoders: list | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(encoder_hidden_states, pooled).

    sd1/sd2: the encoder's last hidden state (after its final layer norm; SD2's encoder already
    ends one layer early), pooled None; with model.clip_skip = n > 1 the hidden state n layers from
    the end through the same final layer norm (kohya's sd-scripts and A1111). sdxl: the penultimate
    hidden states of both encoders concatenated on the feature axis; pooled = encoder 2's projected text embedding.
    Gradients flow through any trainable parameters (e.g. text-encoder LoRA).
    `encoders` replaces model.text_encoders, e.g. with DDP-wrapped ones whose forward syncs
    gradients across processes.
    """
    encoders = encoders or model.text_encoders
    if input_ids[0].ndim == 3:  # long captions: encode every 77-token window, concatenate in order
        batch, chunks = input_ids[0].shape[:2]
        hidden, pooled = encode_text(model, [ids.reshape(batch * chunks, -1) for ids in input_ids], encoders)
        hidden = hidden.reshape(batch, chunks * hidden.shape[1], hidden.shape[2])
        if pooled is not None:  # SDXL's pooled embedding comes from the first window, as kohya does
            pooled = pooled.reshape(batch, chunks, -1)[:, 0]
        return hidden, pooled
    if model.arch != "sdxl":
        encoder = encoders[0]
        if model.clip_skip <= 1:
            return encoder(input_ids[0].to(_device(encoder)))[0], None
        return _skipped_layers(encoder, input_ids[0], model.clip_skip), None
    states, pooled = [], None
    for encoder, ids in zip(encoders, input_ids):
        out = encoder(ids.to(_device(encoder)), output_hidden_states=True)
        if out[0].ndim == 2:  # CLIPTextModelWithProjection: text_embeds
            pooled = out[0]
        states.append(out.hidden_states[-2])
    return torch.cat(states, dim=-1), pooled


def _skipped_layers(encoder, input_ids: torch.Tensor, clip_skip: int) -> torch.Tensor:
    """hidden_states[-clip_skip] through the encoder's final layer norm."""
    from ...errors import ConfigError
    inner = getattr(encoder, "module", encoder)  # DDP-wrapped while the text encoder trains
    layers = inner.config.num_hidden_layers
    if clip_skip > layers:
        raise ConfigError(f"model.clip_skip: {clip_skip} is more than the text encoder's {layers} layers")
    states = encoder(input_ids.to(_device(encoder)), output_hidden_states=True).hidden_states
    return inner.final_layer_norm(states[-clip_skip])


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def sdxl_add_time_ids(original_size: tuple[int, int], crop_top_left: tuple[int, int],
                      target_size: tuple[int, int]) -> torch.Tensor:
    """SDXL's micro-conditioning for one image: (6,) = original (h, w), crop (top, left), target (h, w)."""
    return torch.tensor([*original_size, *crop_top_left, *target_size], dtype=torch.float32)
