"""What kohya-layout LoRA files of fused original modules share (Flux's and SD3's kohya_lora.py):
one adapter on a fused layer (q, k, v in one `qkv` Linear) from the adapters of its diffusers parts,
the file entries (`lora_down`, `lora_up`, `alpha`), and the merge ComfyUI's LoRA loader and kohya's
merge scripts do with such a file (the check that a file holds the trained update)."""
from __future__ import annotations

from typing import Callable

import torch


def swap_rows(t: torch.Tensor) -> torch.Tensor:
    a, b = t.chunk(2, dim=0)
    return torch.cat([b, a], dim=0)


def fuse(parts: list[str], present: dict[str, tuple[torch.Tensor, torch.Tensor, float]],
          out_features: Callable[[str], int]) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One adapter on the fused layer from the parts' (down, up, alpha): (down, up, alpha)."""
    if len(parts) == 1:
        return present[parts[0]]
    scales = {p: alpha / down.shape[0] for p, (down, _, alpha) in present.items()}
    first = next(p for p in parts if p in present)
    rank = sum(down.shape[0] for down, _, _ in present.values())
    sizes = [out_features(p) for p in parts]
    downs, up = [], torch.zeros(sum(sizes), rank)
    row = col = 0
    for part, size in zip(parts, sizes):
        if part in present:
            down, part_up, _ = present[part]
            r = down.shape[0]
            downs.append(down)
            # a part scaled differently from the first is rescaled into its up block (kohya has one alpha)
            up[row:row + size, col:col + r] = part_up * (scales[part] / scales[first])
            col += r
        row += size
    return torch.cat(downs, dim=0), up, scales[first] * rank


def entry(name: str, down: torch.Tensor, up: torch.Tensor, alpha: float) -> dict[str, torch.Tensor]:
    return {f"{name}.lora_down.weight": down.contiguous(), f"{name}.lora_up.weight": up.contiguous(),
            f"{name}.alpha": torch.tensor(alpha)}


def to_kohya_fused(state_dicts: dict[str, dict[str, torch.Tensor]], alpha: float | Callable[[str, str], float],
                   denoiser, original_module: Callable[[str], tuple[str, list[str]]], text_encoders: dict[str, str],
                   swapped: Callable[[str], bool], layout: str) -> dict[str, torch.Tensor]:
    """peft LoRA weights per component -> a kohya file of the original modules.
    original_module: diffusers module path -> (original module path, the diffusers parts fused into it);
    text_encoders: component -> kohya prefix (lora_te1, ...), named on transformers 4's module paths;
    swapped: the original modules whose output halves are (shift, scale) against diffusers' (scale, shift).
    `denoiser` (any device, meta too) gives the output sizes of fused parts that carry no adapter."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, tuple[list[str], dict]] = {}
    for component, sd in state_dicts.items():
        for key in sd:
            if not key.endswith("lora_A.weight"):
                if key.endswith("lora_B.weight"):
                    continue
                raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
            module = key[: -len(".lora_A.weight")]
            down, up = sd[key], sd[f"{module}.lora_B.weight"]
            value = float(alpha(component, module) if callable(alpha) else alpha)
            if component in text_encoders:  # CLIP on transformers 4's module paths, as kohya names them
                path = module if module.startswith("text_model.") or module == "text_projection" \
                    else "text_model." + module
                out.update(entry(f"{text_encoders[component]}_" + path.replace(".", "_"), down, up, value))
                continue
            if component != "transformer":
                raise ValueError(f"kohya's {layout} LoRA layout has no place for {component} adapters")
            orig, parts = original_module(module)
            groups.setdefault(orig, (parts, {}))[1][module] = (down, up, value)

    def out_features(path: str) -> int:
        return denoiser.get_submodule(path).out_features

    for orig, (parts, present) in groups.items():
        down, up, value = fuse(parts, present, out_features)
        if swapped(orig):
            up = swap_rows(up)
        out.update(entry("lora_unet_" + orig.replace(".", "_"), down, up, value))
    return out


def merge_into_original(original: dict[str, torch.Tensor], kohya: dict[str, torch.Tensor],
                        multiplier: float = 1.0) -> dict[str, torch.Tensor]:
    """What ComfyUI's LoRA loader and kohya's merge do with such a file: add multiplier · alpha/rank ·
    up @ down to each named original-layout weight (a copy; text-encoder entries are skipped)."""
    merged = dict(original)
    for key, down in kohya.items():
        if not (key.startswith("lora_unet_") and key.endswith(".lora_down.weight")):
            continue
        name = key[: -len(".lora_down.weight")]
        target = _original_key(name, original)
        up, alpha = kohya[f"{name}.lora_up.weight"], float(kohya[f"{name}.alpha"])
        merged[target] = original[target] + multiplier * (alpha / down.shape[0]) * (up.float() @ down.float())
    return merged


def _original_key(name: str, original: dict) -> str:
    """`lora_unet_double_blocks_0_img_attn_qkv` -> `double_blocks.0.img_attn.qkv.weight` (by lookup:
    the underscores of the file name are ambiguous)."""
    flat = name[len("lora_unet_"):]
    for key in original:
        if key.endswith(".weight") and key[: -len(".weight")].replace(".", "_") == flat:
            return key
    raise KeyError(f"{name}: no such module in the original layout")


# ---------------------------------------------------------------- reading such a file back (network.network_weights)

def is_kohya_layout(state: dict) -> bool:
    return any(k.startswith(("lora_unet_", "lora_te")) and k.endswith(".lora_down.weight") for k in state)


def _linear_paths(module) -> list[str]:
    """The module paths of a (peft-adapted or plain) model's Linear layers, without peft's own layers."""
    paths = []
    for path, layer in module.named_modules():
        if isinstance(layer, torch.nn.Linear) and ".lora_" not in path:
            paths.append(path.removesuffix(".base_layer"))
    return paths


def _adapter_ranks(module) -> dict[str, int] | None:
    """module path -> rank of its configured LoRA adapter; None for a plain model without adapters (the
    LoRA tools read files onto the base itself: split_fused then reads the ranks off the file)."""
    from peft.utils import get_peft_model_state_dict
    if not getattr(module, "peft_config", None):
        return None
    return {k[: -len(".lora_A.weight")]: v.shape[0] for k, v in get_peft_model_state_dict(module).items()
            if k.endswith(".lora_A.weight")}


def _block_diagonal(up: torch.Tensor, rows: list[int], ranks: list[int]) -> bool:
    """True when part i's rows of `up` are zero outside its own columns (ranks in order)."""
    if sum(ranks) != up.shape[1]:
        return False
    col = 0
    for i, r in enumerate(ranks):
        block = up[rows[i]:rows[i + 1]]
        if block[:, :col].any() or block[:, col + r:].any():
            return False
        col += r
    return True


def _block_ranks(up: torch.Tensor, rows: list[int], parts: list[str]) -> dict[str, int]:
    """part -> the columns up to its last nonzero one, after the previous part's (a block-diagonal up's
    ranks); parts whose rows are all zero have none. Not block-diagonal: _block_diagonal then says so."""
    ranks, col = {}, 0
    for i, p in enumerate(parts):
        used = up[rows[i]:rows[i + 1]].abs().sum(0).nonzero().flatten()
        if used.numel():
            end = max(int(used.max()) + 1, col + 1)
            ranks[p], col = end - col, end
    return ranks


def split_fused(down: torch.Tensor, up: torch.Tensor, parts: list[str], sizes: list[int],
                ranks: dict[str, int]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """One fused adapter -> (down, up) per diffusers part, with exactly the parts' updates.
    ranks: the configured adapters' ranks of the parts (parts without one must have zero rows).
    A block-diagonal up (as this studio and kohya's split_qkv write it: each present part on its own
    columns) splits into the parts' own ranks; any other gives each part the whole down and its rows."""
    rows = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    nonzero = [p for i, p in enumerate(parts) if up[rows[i]:rows[i + 1]].any()]
    if ranks is None:  # no configured adapters: each present part's rank from its own columns of a block diagonal
        ranks = _block_ranks(up, rows, parts)
    stray = [p for p in nonzero if p not in ranks]
    if stray:
        raise KeyError(stray[0])
    for present in (nonzero, [p for p in parts if p in ranks]):
        if not present:
            continue
        kept = [(i, p) for i, p in enumerate(parts) if p in present]
        if _block_diagonal(torch.cat([up[rows[i]:rows[i + 1]] for i, _ in kept]),
                           [0, *[sum(sizes[i] for i, _ in kept[:j + 1]) for j in range(len(kept))]],
                           [ranks[p] for _, p in kept]):
            out, col = {}, 0
            for i, p in kept:
                out[p] = (down[col:col + ranks[p]], up[rows[i]:rows[i + 1], col:col + ranks[p]])
                col += ranks[p]
            return out
    return {p: (down, up[rows[i]:rows[i + 1]]) for i, p in enumerate(parts) if p in ranks}


def read_kohya_fused(state: dict, modules: dict, original_module: Callable[[str], tuple[str, list[str]]],
                     text_encoders: dict[str, str], swapped: Callable[[str], bool], layout: str):
    """A kohya-layout file of the original modules (what to_kohya_fused writes, and kohya's own files)
    -> families/lora_files.py's LoraWeights: peft keys per component with each module's scale
    (the file's alpha / its rank). `modules`: component -> the (adapted) module the adapters go on.
    ConfigError naming network.network_weights and the file's name that fits nothing."""
    from ..errors import ConfigError
    from .lora_files import KEY, LoraWeights
    names: dict[str, tuple[str, str, list[str]]] = {}   # kohya name -> (component, original, parts)
    denoiser = modules.get("transformer")
    if denoiser is not None:
        for path in _linear_paths(denoiser):
            try:
                orig, parts = original_module(path)
            except ValueError:
                continue
            names["lora_unet_" + orig.replace(".", "_")] = ("transformer", orig, parts)
    for component, prefix in text_encoders.items():
        if component in modules:
            for path in _linear_paths(modules[component]):  # named as the writer names them (transformers 4)
                named = path if path.startswith("text_model.") or path == "text_projection" else "text_model." + path
                names[f"{prefix}_" + named.replace(".", "_")] = (component, path, [path])
    ranks = {component: _adapter_ranks(module) for component, module in modules.items()}
    out = LoraWeights(layout=f"kohya {layout}")
    for key, down in state.items():
        if not key.endswith(".lora_down.weight"):
            if not key.endswith((".lora_up.weight", ".alpha")):
                raise ConfigError(f"{KEY}: {key} is not a LoRA weight kohya's {layout} layout has (lora_down, "
                                  f"lora_up, alpha)")
            continue
        name = key[: -len(".lora_down.weight")]
        if name not in names:
            te = next((c for c, p in text_encoders.items() if name.startswith(p + "_")), None)
            if te is not None and te not in modules:  # load_network_weights says the run does not train it
                out.add(te, name, "lora_A", down)
                continue
            raise ConfigError(f"{KEY}: {name} is not a module of this {layout} model (or not one this run adapts)")
        component, orig, parts = names[name]
        up = state[f"{name}.lora_up.weight"].float()
        if swapped(orig):
            up = swap_rows(up)
        rank = down.shape[0]
        scale = float(state.get(f"{name}.alpha", torch.tensor(float(rank)))) / rank
        module = modules[component]
        sizes = [module.get_submodule(p).out_features if len(parts) > 1 else up.shape[0] for p in parts]
        try:
            split = split_fused(down.float(), up, parts, sizes, ranks[component]) if len(parts) > 1 \
                else {parts[0]: (down, up)}
        except KeyError as e:
            raise ConfigError(f"{KEY}: the file's {name} adapts {e.args[0]}, which the configured network does "
                              f"not (network.target_modules)") from None
        for part, (part_down, part_up) in split.items():
            out.add(component, part, "lora_A", part_down)
            out.add(component, part, "lora_B", part_up)
            out.scales[(component, part)] = scale
    return out
