"""Qwen-Image 2.1 LoRA files in the layout ComfyUI loads (output.lora_format = "original"): ComfyUI's
model holds each block's SwiGLU gate and up projections fused as one `img_mlp.gate_up` weight (gate rows
first: single_file.py), so a LoRA on diffusers' separate `img_mlp.gate_layer` / `img_mlp.proj` would miss
it. Written: `diffusion_model.<module>.lora_A.weight` / `lora_B.weight` (alpha folded into lora_B, no
alpha keys) with the two projections' adapters joined exactly into one on `img_mlp.gate_up`:
lora_A = [A_gate; A_up] (rank r_gate + r_up), lora_B = [[B_gate, 0], [0, B_up]], so B·A = [ΔW_gate; ΔW_up].
Read back (network_weights, the LoRA tools), any fused gate_up LoRA is split exactly: each half of B with
the whole A (our block-diagonal files go back to their own ranks). diffusers' own converter reads the
attention keys of such a file; the fused MLP it cannot place, which is what to_diffusers is for."""
from __future__ import annotations

PREFIX = "diffusion_model."
GATE, UP, FUSED = "img_mlp.gate_layer", "img_mlp.proj", "img_mlp.gate_up"
DENOISER = "transformer"


def _split_key(key: str) -> tuple[str, str]:
    """`<module>.lora_A.weight` -> (module, "A"); lora_down/lora_up count as A/B."""
    for marker, side in ((".lora_A.", "A"), (".lora_B.", "B"), (".lora_down.", "A"), (".lora_up.", "B")):
        if marker in key:
            return key.split(marker)[0], side
    raise ValueError(f"{key!r} is not a LoRA weight (lora_A/lora_B or lora_down/lora_up)")


def to_original(diffusers_state: dict) -> dict:
    """A diffusers-layout LoRA (`transformer.<module>.lora_A.weight`, alpha folded) -> ComfyUI's layout."""
    import torch
    out, mlp = {}, {}
    for key, tensor in diffusers_state.items():
        component, rest = key.split(".", 1)
        if component != DENOISER:
            raise ValueError(f"{key!r}: Qwen-Image 2.1's ComfyUI layout holds transformer adapters only")
        module, side = _split_key(rest)
        for part in (GATE, UP):
            if module.endswith("." + part):
                mlp.setdefault(module[:-len(part)], {})[(part, side)] = tensor
                break
        else:
            out[f"{PREFIX}{module}.lora_{side}.weight"] = tensor
    for block, parts in mlp.items():
        a_gate, b_gate, a_up, b_up = (parts.get(k) for k in ((GATE, "A"), (GATE, "B"), (UP, "A"), (UP, "B")))
        present = b_gate if b_gate is not None else b_up
        hidden, dtype = present.shape[0], present.dtype
        rank_gate = 0 if a_gate is None else a_gate.shape[0]
        rank_up = 0 if a_up is None else a_up.shape[0]
        b = torch.zeros(2 * hidden, rank_gate + rank_up, dtype=dtype)
        if a_gate is not None:
            b[:hidden, :rank_gate] = b_gate
        if a_up is not None:
            b[hidden:, rank_gate:] = b_up
        a = torch.cat([t for t in (a_gate, a_up) if t is not None])
        out[f"{PREFIX}{block}{FUSED}.lora_A.weight"] = a.contiguous()
        out[f"{PREFIX}{block}{FUSED}.lora_B.weight"] = b
    return out


def is_original(state: dict) -> bool:
    return any(f".{FUSED}." in k for k in state) or any(k.startswith(PREFIX) for k in state)


def to_diffusers(original_state: dict) -> dict:
    """ComfyUI's layout (lora_A/B or lora_down/up, optional `.alpha`, folded here) -> diffusers' names, the
    fused gate_up split exactly into gate_layer and proj adapters."""
    found: dict[str, dict[str, object]] = {}
    for key, tensor in original_state.items():
        name = key.removeprefix(PREFIX).removeprefix(DENOISER + ".")
        if name.endswith(".alpha"):
            found.setdefault(name[:-len(".alpha")], {})["alpha"] = tensor
            continue
        module, side = _split_key(name)
        found.setdefault(module, {})[side] = tensor
    out = {}
    for module, parts in found.items():
        if "A" not in parts or "B" not in parts:
            raise ValueError(f"{module}: the LoRA file has only one of its two matrices")
        a, b = parts["A"], parts["B"]
        if "alpha" in parts:
            b = b * (float(parts["alpha"]) / a.shape[0])
        if not module.endswith("." + FUSED):
            out[f"{DENOISER}.{module}.lora_A.weight"], out[f"{DENOISER}.{module}.lora_B.weight"] = a, b
            continue
        block, hidden, rank = module[:-len(FUSED)], b.shape[0] // 2, a.shape[0]
        halves = {GATE: (a, b[:hidden]), UP: (a, b[hidden:])}
        cut = rank // 2
        if rank % 2 == 0 and not b[:hidden, cut:].any() and not b[hidden:, :cut].any():  # block-diagonal: ours
            halves = {GATE: (a[:cut], b[:hidden, :cut]), UP: (a[cut:], b[hidden:, cut:])}
        for part, (pa, pb) in halves.items():
            out[f"{DENOISER}.{block}{part}.lora_A.weight"] = pa.contiguous()
            out[f"{DENOISER}.{block}{part}.lora_B.weight"] = pb.contiguous()
    return out
