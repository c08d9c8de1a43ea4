"""model.expert = "both": Wan 2.2's two experts trained in one run as one denoiser module. Each sample goes
to the expert that denoises its timestep at sampling (families/wan/experts.py: `transformer` at or above
the boundary, `transformer_2` below), so each expert trains only over its own range; the adapters of
each are written to their own LoRA file (Wan22Family.lora_file_parts)."""
from __future__ import annotations

import torch
from diffusers.loaders import PeftAdapterMixin
from diffusers.models.modeling_utils import ModelMixin

EXPERTS = ("transformer", "transformer_2")
LOW_NOISE_SUFFIX = "_low_noise"  # `<name>_low_noise.safetensors` beside `<name>.safetensors` (the high-noise one)


class WanExperts(ModelMixin, PeftAdapterMixin):
    """The two experts under their pipeline names (adapter keys `transformer.…` and `transformer_2.…`);
    a diffusers model so peft's add_adapter and gradient checkpointing reach both."""
    _supports_gradient_checkpointing = True

    def __init__(self, transformer, transformer_2, boundary: float):
        super().__init__()
        self.transformer, self.transformer_2, self.boundary = transformer, transformer_2, float(boundary)

    def forward(self, hidden_states, timestep, encoder_hidden_states, return_dict: bool = False, **kwargs):
        high = timestep >= self.boundary
        out = None
        for mask, expert in ((high, self.transformer), (~high, self.transformer_2)):
            if bool(mask.any()):
                pred = expert(hidden_states=hidden_states[mask], timestep=timestep[mask],
                              encoder_hidden_states=encoder_hidden_states[mask], return_dict=False, **kwargs)[0]
                if out is None:  # I2V: fewer channels out (the latents') than in (latents ++ mask ++ condition)
                    out = hidden_states.new_empty((hidden_states.shape[0], *pred.shape[1:]))
                out[mask] = pred.to(out.dtype)
        return (out,)


def split_expert_states(state: dict) -> dict[str, dict]:
    """Adapter weights of WanExperts -> {expert name: its own weights (keys without the expert prefix)}."""
    out: dict[str, dict] = {name: {} for name in EXPERTS}
    for key, value in state.items():
        name, _, rest = key.partition(".")
        if name not in out:
            raise ValueError(f"unexpected adapter key {key!r}: not under {' or '.join(EXPERTS)}")
        out[name][rest] = value
    return out
