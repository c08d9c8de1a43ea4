"""LoRA files in and out for the tools, through the project's own readers and writers: the family reads any
layout it knows (kohya/webui, diffusers, ComfyUI's, kohya's fused q/k/v; `Family.read_lora_file`) into peft's
layout, and writes one (`methods/kohya_format.save_lora_file` over `Family.lora_file_state`). Before a tool
writes anything, every module of every input must land on a layer of the base with the right shape (`fit`);
outputs are written atomically and never over an input."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ConfigError

Key = tuple[str, str]  # (component, module path), e.g. ("unet", "down_blocks.0.attentions.0...to_q")


@dataclass
class LoraFile:
    path: Path
    modules: dict[Key, tuple[torch.Tensor, torch.Tensor, float]]  # (A, B, scale = alpha / rank)
    metadata: dict[str, str] = field(default_factory=dict)
    layout: str = ""           # as the family's reader names it: kohya, diffusers, converted by diffusers, ...
    keys: int = 0              # tensors in the file


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import SafetensorError, safe_open
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable .safetensors file ({e})") from None


def components(model) -> dict[str, torch.nn.Module]:
    """The modules LoRA files put adapters on: the denoiser and the text encoders."""
    family = model.family
    return {family.denoiser_name: model.denoiser, **dict(zip(family.text_encoder_names, model.text_encoders))}


def split_spec(spec: str) -> tuple[Path, float]:
    """FILE[:WEIGHT] (a Windows drive letter is no weight: the weight is a number after the last colon)."""
    head, sep, tail = spec.rpartition(":")
    if sep:
        try:
            return Path(head), float(tail)
        except ValueError:
            pass
    return Path(spec), 1.0


def read_lora(model, path: Path) -> LoraFile:
    """A LoRA file mapped onto `model` (a LoadedModel), checked to fit (ConfigError naming the file)."""
    from ..methods.variants import METADATA_KEY
    state, header = read_safetensors(path)
    if METADATA_KEY in header:   # updates.py reads them for merge, resize and sampling
        kind = "/".join(sorted({variant_name(c) for c in configs_of(header).values()}))
        raise ConfigError(f"{path}: a {kind} file (peft layout), whose update is not one low-rank product B·A: "
                          f"mix takes LoRA/LoCon files only (merge bakes it, resize turns it into a LoRA)")
    mods = components(model)
    try:
        weights = model.family.read_lora_file(model, state, mods)
    except ConfigError as e:
        raise ConfigError(str(e).replace("network.network_weights", str(path), 1)) from None
    found: dict[Key, tuple] = {}
    for component, tensors in weights.weights.items():
        for key, a in tensors.items():
            if key.endswith(".lora_A.weight"):
                module = key[:-len(".lora_A.weight")]
                b = tensors.get(f"{module}.lora_B.weight")
                if b is None:
                    raise ConfigError(f"{path}: {component} {module} has lora_A/lora_down but no lora_B/lora_up")
                found[(component, module)] = (a, b, weights.scales.get((component, module), 1.0))
    if not found:
        raise ConfigError(f"{path}: no LoRA modules in the file ({len(state)} keys, e.g. {next(iter(state), '-')})")
    out = LoraFile(Path(path), found, header, weights.layout, len(state))
    fit(model, out)
    return out


def configs_of(metadata: dict) -> dict[str, dict]:
    """component -> its packed peft config (a dict for PeftConfig.from_peft_type)."""
    from ..methods.variants import METADATA_KEY
    packed = json.loads(metadata[METADATA_KEY])
    out: dict[str, dict] = {}
    for key, value in packed.items():
        component, _, field = key.partition(".")
        out.setdefault(component, {})[field] = value
    return out


def variant_name(config: dict) -> str:
    kind = str(config.get("peft_type", "?")).upper()
    if kind == "LORA":
        return "DoRA" if config.get("use_dora") else "LoRA"
    return {"LOHA": "LoHa", "LOKR": "LoKr"}.get(kind, kind)


def fit(model, lora: LoraFile) -> None:
    """Every module names a layer of the base and its update has the layer's weight shape; else one line
    with the count and the first mismatches (keys and shapes)."""
    mods = components(model)
    bad = []
    for (component, module), (a, b, _) in lora.modules.items():
        shape = (b.shape[0], *a.shape[1:])
        try:
            weight = mods[component].get_submodule(module).weight
        except (KeyError, AttributeError):
            bad.append(f"{component} {module} (no such layer)")
            continue
        if tuple(weight.shape) != tuple(shape) and tuple(weight.shape) != tuple(shape) + (1, 1):
            bad.append(f"{component} {module}: lora_A {tuple(a.shape)} x lora_B {tuple(b.shape)} makes "
                       f"{tuple(shape)}, the base's weight is {tuple(weight.shape)}")
    if bad:
        raise ConfigError(f"{lora.path}: {len(bad)} of {len(lora.modules)} modules do not fit the base model "
                          f"({model.family.label}): {'; '.join(bad[:3])}{' …' if len(bad) > 3 else ''}")


def layer_weight(model, key: Key) -> torch.nn.Parameter:
    return components(model)[key[0]].get_submodule(key[1]).weight


def output_layout(model, requested: str, inputs: list[LoraFile]) -> str:
    """The layout to write: the one asked for, else the first input's where the family writes it, else the
    family's default (Family.lora_layout checks the name)."""
    if requested and requested != "auto":
        return model.family.lora_layout(requested)
    layouts = model.family.lora_layouts()
    for f in inputs:
        if f.layout in layouts:
            return f.layout
    return layouts[0]


def check_output(out: Path, inputs: list[Path], force: bool) -> Path:
    out = Path(out).expanduser()
    for p in inputs:
        if Path(p).expanduser().resolve() == out.resolve():
            raise ConfigError(f"--out {out}: that is an input; the tools never overwrite their input")
    if out.exists() and not force:
        raise ConfigError(f"--out {out}: exists; choose another name (or --force to replace it)")
    return out


def write_lora(model, modules: dict[Key, tuple[torch.Tensor, torch.Tensor]], out: Path, layout: str,
               metadata: dict[str, str]) -> Path:
    """(A, B) with scale 1 per module (alpha = its rank) in the family's `layout`, atomically."""
    from ..methods.kohya_format import save_lora_file
    states: dict[str, dict[str, torch.Tensor]] = {}
    ranks: dict[Key, int] = {}
    for (component, module), (a, b) in modules.items():
        states.setdefault(component, {})[f"{module}.lora_A.weight"] = a.float().contiguous()
        states[component][f"{module}.lora_B.weight"] = b.float().contiguous()
        ranks[(component, module)] = a.shape[0]
    dims = sorted(set(ranks.values()))
    meta = {**{k: v for k, v in metadata.items() if k not in ("format",)},
            "ss_network_dim": str(dims[-1]) if len(dims) == 1 else "dynamic",
            "ss_network_alpha": str(float(dims[-1])) if len(dims) == 1 else "dynamic"}
    return save_lora_file(out, model, states, alpha=lambda component, module: float(ranks[(component, module)]),
                          metadata=meta, layout=layout)


_job = None   # the queue job's events (run/events.RunEvents over --job-dir), or None


def set_job(events) -> None:
    global _job
    _job = events


def job_step(step: int, total: int, started: float) -> None:
    """A `step` event in the job folder (the Queue page's and the LoRA tools page's progress)."""
    import time
    from ..run.contract import Event
    if _job is not None:
        rate = step / max(time.monotonic() - started, 1e-6)
        _job.emit(Event.STEP, step=step, total_steps=total, it_per_s=round(rate, 4),
                  eta_s=round(max(total - step, 0) / rate, 1) if rate > 0 else None)


def progress(items, what: str, total: int | None = None):
    """tqdm on stderr, shown only when the work takes more than a second; in a queue job also `step`
    events (at most two a second, and the last)."""
    from tqdm.auto import tqdm
    bar = tqdm(items, desc=what, delay=1.0, leave=False, total=total)
    return bar if _job is None else _reported(bar, total if total is not None else bar.total)


def _reported(bar, total):
    import time
    started = last = time.monotonic()
    count = 0
    for item in bar:
        yield item
        count += 1
        now = time.monotonic()
        if total and (now - last >= 0.5 or count == total):
            job_step(count, int(total), started)
            last = now
