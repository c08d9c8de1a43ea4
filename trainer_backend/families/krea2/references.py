"""Krea 2 editing: reference (control) images as extra tokens of diffusers' own Krea2Transformer2DModel,
laid out as the community edit LoRA (ostris's Krea2OstrisEdit, ai-toolkit's `edit` mode, and its
ComfyUI-Krea2-Ostris-Edit nodes) lays them out, so a LoRA trained here and that one meet the same inputs:

- each reference's latents are packed 2×2 like the target and appended AFTER the target's tokens:
  the sequence is [text | target | reference 1 | reference 2 …];
- rotary positions (t, h, w): text at the origin, the target at (0, h, w), the i-th reference at
  (i + 1, h, w) on its own grid from 0 (Flux Kontext's index placement: the base model never saw t ≠ 0,
  so the references read as other frames of the same picture);
- the reference tokens are modulated with timestep 0 (clean images; "index_timestep_zero" in ComfyUI's
  Kontext code), the text and target tokens with the step's timestep;
- the prediction is the target's tokens only (the loss never sees the references' outputs).

The transformer itself is not changed: while `attached` is active, hooks on the model (its forward's
inputs and output, and the shared modulation projection `time_mod_proj`) append the tokens, extend the
positions, give the reference tokens the t = 0 modulation and cut the output back to the target. The
forward call still goes through the model's own `__call__` (DDP, block swap, gradient checkpointing
and peft's adapters see an ordinary call)."""
from __future__ import annotations

import contextlib

REFERENCE_TIMESTEP = 0.0  # the references are clean latents


def reference_positions(count: int, grid_height: int, grid_width: int, device, first: int = 0):
    """(count · h · w, 3) rotary coordinates of `count` references on an h × w packed grid: the i-th (counted
    from `first`) at (i + 1, row, column)."""
    import torch
    rows = torch.arange(grid_height, device=device).repeat_interleave(grid_width)
    cols = torch.arange(grid_width, device=device).repeat(grid_height)
    grid = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).float()
    return torch.cat([grid + torch.tensor([i + 1.0, 0.0, 0.0], device=device)
                      for i in range(first, first + count)], dim=0)


def pack_references(references: list, device, dtype):
    """A list of [B, C, h_i, w_i] reference latents (sizes may differ: each keeps its own grid) ->
    (tokens [B, Σ h_i·w_i/4, 4C], positions [Σ h_i·w_i/4, 3])."""
    import torch
    from ..qwen_image.family import pack
    tokens = torch.cat([pack(r.to(device, dtype)) for r in references], dim=1)
    positions = torch.cat([reference_positions(1, r.shape[-2] // 2, r.shape[-1] // 2, device, first=i)
                           for i, r in enumerate(references)], dim=0)
    return tokens, positions


@contextlib.contextmanager
def attached(transformer, tokens, positions):
    """Every forward of `transformer` (a Krea2Transformer2DModel, or a wrapper such as DDP whose `module`
    is one) inside this block also carries the reference `tokens` ([B or 1, L, C], broadcast over the
    call's batch) at `positions` ([L, 3]), modulated at t = 0, and returns the target's tokens only."""
    import torch
    import torch.nn.functional as F
    model = getattr(transformer, "module", transformer)
    n_ref = tokens.shape[1]
    state = {}

    def before(module, args, kwargs):
        hidden = kwargs["hidden_states"]
        b, n_target = hidden.shape[:2]
        refs = tokens.to(hidden.device, hidden.dtype)
        refs = refs.expand(b, -1, -1) if refs.shape[0] == 1 else refs
        state["main"] = kwargs["encoder_hidden_states"].shape[1] + n_target  # text + target tokens
        state["target"], state["dtype"] = n_target, hidden.dtype
        state["zero"] = torch.full_like(kwargs["timestep"], REFERENCE_TIMESTEP)
        kwargs = dict(kwargs, hidden_states=torch.cat([hidden, refs], dim=1),
                      position_ids=torch.cat([kwargs["position_ids"], positions.to(kwargs["position_ids"])], dim=0))
        return args, kwargs

    def modulation(module, args, out):
        if state.get("inside"):  # the t = 0 modulation being computed below
            return out
        state["inside"] = True
        try:  # the same path as the model's: time_mod_proj(gelu(time_embed(t)))
            zero = module(F.gelu(model.time_embed(state["zero"], dtype=state["dtype"]), approximate="tanh"))
        finally:
            state["inside"] = False
        b = out.shape[0]
        return torch.cat([out.expand(b, state["main"], -1), zero.expand(b, n_ref, -1)], dim=1)

    def after(module, args, kwargs, out):
        cut = out[0][:, :state["target"]] if isinstance(out, tuple) else out.sample[:, :state["target"]]
        if isinstance(out, tuple):
            return (cut, *out[1:])
        out.sample = cut
        return out

    handles = [model.register_forward_pre_hook(before, with_kwargs=True),
               model.time_mod_proj.register_forward_hook(modulation),
               model.register_forward_hook(after, with_kwargs=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
