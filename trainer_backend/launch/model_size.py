"""The model the planner plans for: its family and its size, read from the model given, as the trainer
reads it (issue 29 item 8). Pure: no torch (the studio imports it).

- `builtin:tiny-<family>` names their family (families/registry.py BUILTIN_TINY) and a tiny model whose
  weights' shapes tools/make_memory_tables.py --builtin recorded (assets/memory_tables.json "builtin",
  read from the tiny model's own files by `folder_components`);
- a diffusers folder: its model_index.json names the pipeline class (the family, where one family's
  models use it), and its weight files' safetensors headers give every component's exact size;
- a single file: the family's (or its variant's, memory_tables.variant_table) full-size table.

A model whose denoiser differs in size from the family's full-size table gets the table sized to it
(`sized_table`): exact parameter counts and layers from the headers; activations, FLOPs and the
encoders' passes scaled by how the layers' widths and counts compare (an estimate: docs/memory.md).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from .memory_tables import TABLES, _load, family_table, variant_table

HEADER_LIMIT = 100_000_000
SAME_SIZE = (0.8, 1.25)      # a denoiser this close to the table's is the table's model
_INDEX = re.compile(r"\.(\d+)(?=\.|$)")


def header_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a .safetensors file's header (8 bytes of length, then JSON); {} when
    the file is not one."""
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 0 < length < HEADER_LIMIT:
                return {}
            header = json.loads(f.read(length))
    except (OSError, ValueError):
        return {}
    if not isinstance(header, dict):
        return {}
    return {k: list(v.get("shape", [])) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def shapes_component(shapes: dict[str, list[int]]) -> dict:
    """A component's entry in the planner's format (launch/memory_tables.py) from its tensors' shapes:
    the exact parameter count, and its layers as [name pattern, in, out, kernel area (0 = Linear), count]:
    every 2-D `.weight` is taken as a Linear layer, every 4-D one as a convolution."""
    rows: dict[tuple, int] = {}
    params = 0
    for name, shape in shapes.items():
        params += math.prod(shape) if shape else 1
        if not name.endswith(".weight") or len(shape) not in (2, 4):
            continue
        module = _INDEX.sub(r".#", name[:-len(".weight")])
        key = (module, shape[1], shape[0], shape[2] * shape[3] if len(shape) == 4 else 0)
        rows[key] = rows.get(key, 0) + 1
    return {"params": params, "layers": [[*k, n] for k, n in sorted(rows.items())]}


def folder_components(folder: Path, names) -> dict[str, dict] | None:
    """Each named component of a diffusers folder from its weight files' headers; None when one has no
    readable .safetensors weights (a .bin folder: the family's table is used). `names` may be a table's
    components: an entry's companions (its "with": LTX-2's connectors beside the text encoder) are read
    from their own folders and counted in it, as the table counts them."""
    out = {}
    for name in names:
        shapes: dict[str, list[int]] = {}
        for file in sorted((folder / name).glob("*.safetensors")):
            shapes.update(header_shapes(file))
        if not shapes:
            return None
        for companion in (names[name].get("with") or {}) if isinstance(names, dict) else ():
            for file in sorted((folder / companion).glob("*.safetensors")):
                shapes.update({f"{companion}.{k}": v for k, v in header_shapes(file).items()})
        out[name] = shapes_component(shapes)
    return out


def builtin_entry(name: str, path: Path = TABLES) -> dict | None:
    """The recorded entry of a builtin tiny model ("tiny-flux"): family, pipeline, components."""
    return _load(str(path)).get("builtin", {}).get(name)


def pipeline_class(folder: Path) -> str:
    try:
        index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return index.get("_class_name", "") if isinstance(index, dict) else ""


def families_of_pipeline(name: str, path: Path = TABLES) -> list[str]:
    """The families whose models use this pipeline class (the tiny models' classes, the tables' own)."""
    data = _load(str(path))
    found = [e["family"] for e in data.get("builtin", {}).values() if e.get("pipeline") == name]
    found += [arch for arch, t in data["families"].items() if name in (t.get("pipelines") or ())]
    return list(dict.fromkeys(found))


def planning_arch(cfg) -> str:
    """model.arch, else the family the model given names (`arch_of`)."""
    return arch_of(cfg.model.arch, cfg.model.path)


def arch_of(arch: str, model_path: str) -> str:
    """`arch` unless it is "auto", else the family the model given names: a builtin name's, or a diffusers
    folder's pipeline class (the nearest family in size where several use it); "auto" when that does
    not decide it (a single file, a path that does not exist)."""
    if arch != "auto":
        return arch
    text = str(model_path or "").strip()
    if text.startswith("builtin:"):
        from ..families.registry import BUILTIN_TINY
        return BUILTIN_TINY.get(text[len("builtin:"):], ("auto", ""))[0]
    folder = _folder(text)
    if folder is not None:
        found = families_of_pipeline(pipeline_class(folder))
        if len(found) > 1:   # one pipeline class, several families (SD1 and SD2, Wan 2.2 T2V and TI2V): the
            # nearest in size, a full-size model to its family's table, a tiny one to the family's tiny model
            found = sorted(found, key=lambda arch: min(size_distance(folder, family_table(arch)),
                                                       size_distance(folder, builtin_entry(f"tiny-{arch}"))))[:1]
        if found:
            return found[0]
    return "auto"


def size_distance(folder: Path, table: dict | None) -> float:
    """How far a folder's components are in size from a table's: Σ |log(params ratio)| (inf: unreadable)."""
    components = folder_components(folder, table["components"]) if table else None
    if not components:
        return math.inf
    return sum(abs(math.log(max(c["params"], 1) / max(table["components"][name]["params"], 1)))
               for name, c in components.items())


def _folder(text: str) -> Path | None:
    if not text:
        return None
    from ..config.paths import resolve_path
    folder = Path(resolve_path(text)).expanduser()
    return folder if folder.is_dir() else None


def _widths(component: dict) -> float:
    """Σ out-features × count over the layers: what one token's activations grow with."""
    return float(sum(o * n for _, _, o, _, n in component.get("layers") or [])) or 1.0


def _macs(component: dict) -> float:
    """Σ in × out × kernel area × count: what one token's forward FLOPs grow with."""
    return float(sum(i * o * max(k, 1) * n for _, i, o, k, n in component.get("layers") or [])) or 1.0


def _scaled_line(line, ratio: float) -> list[float]:
    return [line[0] * ratio, line[1] * ratio]


def resize_table(table: dict, components: dict[str, dict]) -> dict:
    """`table` (a family's full-size table) for a model of the same family with these components:
    their parameter counts and layers; the quantizable weights, the block sizes, the activation lines,
    the FLOP lines and the encoders' passes scaled by the ratios of layer widths (activations) and
    multiply-adds (FLOPs, quantizable weights) of the model's components to the table's."""
    out = {**table, "components": {}}
    for name, full in table["components"].items():
        mine = components.get(name)
        if mine is None:
            out["components"][name] = full
            continue
        ratio = mine["params"] / max(full["params"], 1)
        entry = {**full, "params": mine["params"], "layers": mine["layers"],
                 "quantizable": [round(v * r) for v, r in zip(full["quantizable"],
                                                               (ratio, math.sqrt(ratio), 1, ratio, ratio))]}
        if full.get("blocks"):
            entry["blocks"] = [round(b * ratio) for b in full["blocks"]]
        out["components"][name] = entry
    den, comps = table["denoiser"], out["components"]
    act = _widths(comps[den]) / _widths(table["components"][den])
    out["activations"] = {k: _scaled_line(v, act) for k, v in table["activations"].items()}
    if table.get("activations_if"):  # the lines of runs with the table's option on (memory_plan.activation_lines)
        rule = table["activations_if"]
        out["activations_if"] = {**rule, "lines": {k: _scaled_line(v, act) for k, v in rule["lines"].items()}}
    if table.get("flops"):
        flops = _macs(comps[den]) / _macs(table["components"][den])
        vae_flops = _macs(comps["vae"]) / _macs(table["components"]["vae"])
        out["flops"] = {**table["flops"], "denoiser_forward": _scaled_line(table["flops"]["denoiser_forward"], flops)}
        if "vae_encode" in table["flops"]:
            out["flops"]["vae_encode"] = _scaled_line(table["flops"]["vae_encode"], vae_flops)
    text = [(_widths(comps[n]), _widths(table["components"][n])) for n in table["text_encoders"]]
    out["text_encode"] = table["text_encode"] * (sum(a for a, _ in text) / max(sum(b for _, b in text), 1.0))
    out["vae_encode"] = _scaled_line(table["vae_encode"], _widths(comps["vae"]) / _widths(table["components"]["vae"]))
    out["sized_from"] = {n: c["params"] for n, c in components.items()}
    return out


def model_components(arch: str, model_path: str, table: dict) -> dict[str, dict] | None:
    """The components of the model given, when they can be read without loading it: a builtin tiny
    model's recorded entry, or a diffusers folder's headers; None otherwise (a single file)."""
    text = str(model_path or "").strip()
    if text.startswith("builtin:"):
        entry = builtin_entry(text[len("builtin:"):])
        return entry["components"] if entry and entry.get("family") == arch else None
    folder = _folder(text)
    return folder_components(folder, table["components"]) if folder is not None else None


def sized_table(arch: str, model_path: str) -> dict | None:
    """The planner's table for the model given: the family's (or its variant's) full-size table, sized
    to the model when its denoiser's parameter count differs from the table's by more than SAME_SIZE."""
    table = variant_table(arch, model_path) or family_table(arch)
    if table is None:
        return None
    components = model_components(arch, model_path, table)
    if not components or table["denoiser"] not in components:
        return table
    ratio = components[table["denoiser"]]["params"] / max(table["components"][table["denoiser"]]["params"], 1)
    return table if SAME_SIZE[0] <= ratio <= SAME_SIZE[1] else resize_table(table, components)
