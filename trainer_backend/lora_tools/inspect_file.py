"""`lora inspect FILE [--base MODEL]`: what a LoRA file is (layout, family, ranks, alphas, size, metadata)
and, with the base, whether every module maps onto it (the same check the other tools make first)."""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .files import read_safetensors

PAIRS = {".lora_down.weight": "down", ".lora_up.weight": "up", ".lora_A.weight": "down", ".lora_B.weight": "up"}
SHOWN_METADATA = 400  # characters of a metadata value shown (ss_tag_frequency can be long)


def file_layout(keys: list[str], metadata: dict) -> str:
    from ..methods.variants import METADATA_KEY
    if METADATA_KEY in metadata:
        return "peft (DoRA/LoHa/LoKr, diffusers' save_lora_weights layout)"
    if any(k.endswith(".lora_down.weight") for k in keys):
        return "kohya (lora_down/lora_up/alpha: webui, ComfyUI, kohya's scripts)"
    if any(k.endswith(".lora_A.weight") for k in keys):
        return "diffusers (lora_A/lora_B)"
    return "unknown"


def family_of(metadata: dict) -> str:
    """The registered family the file's metadata names (modelspec.architecture, ss_base_model_version)."""
    from ..families.registry import FAMILY_NAMES, get_family
    arch, version = metadata.get("modelspec.architecture", ""), metadata.get("ss_base_model_version", "")
    best = ""
    for name in FAMILY_NAMES:
        fam = get_family(name)
        if version and version == fam.base_model_version:
            return name
        if arch and fam.modelspec_architecture and arch.startswith(fam.modelspec_architecture) and not best:
            best = name
    return best or "unknown (no modelspec.architecture / ss_base_model_version; give --base to check)"


def inspect(path: Path, base: str = "") -> dict:
    state, metadata = read_safetensors(path)
    modules: dict[str, dict] = {}
    for key, tensor in state.items():
        for suffix, part in PAIRS.items():
            if key.endswith(suffix):
                modules.setdefault(key[:-len(suffix)], {})[part] = tensor
        if key.endswith(".alpha"):
            modules.setdefault(key[:-len(".alpha")], {})["alpha"] = float(tensor)
    ranks = {name: int(m["down"].shape[0]) for name, m in modules.items() if "down" in m}
    alphas = sorted({m["alpha"] for m in modules.values() if "alpha" in m})
    report = {
        "file": str(path), "layout": file_layout(list(state), metadata), "family": family_of(metadata),
        "tensors": len(state), "modules": len(ranks), "parameters": sum(t.numel() for t in state.values()),
        "dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in state.values()}),
        "ranks": _counts(ranks.values()), "alphas": alphas or "none in the file (diffusers: folded into lora_B; "
                                                             "kohya: alpha = rank)",
        "conv_modules": sum(1 for m in modules.values() if "down" in m and m["down"].ndim == 4),
        "rank_per_module": ranks,
        "metadata": {k: (v if len(v) <= SHOWN_METADATA else v[:SHOWN_METADATA] + "…") for k, v in metadata.items()},
    }
    from .variants import is_variant_file, summary
    if is_variant_file(metadata):   # DoRA/LoHa/LoKr: their peft configs say what they are
        adapters = summary(Path(path), state, metadata)
        report.update(adapters=adapters, modules=sum(a["modules"] for a in adapters.values()),
                      ranks=_counts(a["rank"] for a in adapters.values()),
                      alphas=sorted({a["alpha"] for a in adapters.values() if a["alpha"] is not None}),
                      rank_per_module={}, conv_modules=0)
    if base:
        from .tools import load_base
        from .updates import open_updates
        model = load_base(base)
        report["base"] = {"path": base, "family": model.family.name}
        try:
            mapped = open_updates(model, Path(path))
            report["base"].update(fits=True, mapped_modules=mapped.layers,
                                  read_as=mapped.lora.layout if mapped.lora else f"{mapped.kind} (peft)")
        except ConfigError as e:
            report["base"].update(fits=False, problem=str(e))
    return report


def _counts(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out
