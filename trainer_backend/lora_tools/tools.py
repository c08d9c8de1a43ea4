"""The LoRA tools: merge into the base, mix, resize, extract from a fine-tune, post-hoc EMA over a run's
checkpoints. Each reads through files.py (every module checked against the base before anything is
written), writes atomically, never over an input, and reports what it did as a dict (the CLI prints it)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..errors import ConfigError
from . import linalg
from .files import (LoraFile, check_output, components, layer_weight, output_layout, progress, read_lora,
                    write_lora)


def load_base(path: str):
    from ..families import load_model
    return load_model(str(path))


@torch.no_grad()
def merge(base: str, loras: list[tuple[Path, float]], out: Path, force: bool = False) -> dict:
    """Bake LoRAs (each × its weight) into the base: `<out>/` (the family's diffusers folder) and
    `<out>.safetensors` (its single file)."""
    out = Path(str(out).removesuffix(".safetensors"))
    single = out.with_name(out.name + ".safetensors")
    inputs = [p for p, _ in loras]
    check_output(out, inputs, force)
    check_output(single, inputs, force)
    model = load_base(base)
    from .updates import open_updates
    files = [(open_updates(model, path), weight) for path, weight in loras]  # all checked before any change
    changed = 0
    for updates, weight in files:
        for key, update in progress(updates.at(weight), f"merge {updates.path.name}", total=updates.layers):
            w = layer_weight(model, key)
            w.add_(update.reshape(w.shape).to(w.dtype))
            changed += 1
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    meta = {"ss_merged_from": json.dumps([f"{p.name}:{w:g}" for p, w in loras])}
    single_existed = single.exists()
    try:
        model.family.save_full_model(model, tmp, single, metadata=meta)
    except BaseException:   # an error or a Stop mid-write: leave no half-written outputs behind
        shutil.rmtree(tmp, ignore_errors=True)
        if not single_existed:
            single.unlink(missing_ok=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return {"merged_modules": changed, "outputs": [str(single), str(out)], "family": model.family.name,
            "adapters": {str(u.path): u.kind for u, _ in files}}


def _write(model, modules, out: Path, layout: str, inputs: list[LoraFile], extra: dict) -> Path:
    meta = dict(inputs[0].metadata) if inputs else {}
    meta.update(model.family.lora_metadata())
    meta.update(extra)
    return write_lora(model, modules, out, layout, meta)


@torch.no_grad()
def mix(base: str, loras: list[tuple[Path, float]], out: Path, rank: int = 0, layout: str = "auto",
        force: bool = False) -> dict:
    """Several LoRAs as one: ranks concatenated (exact), or with `rank` re-factored by SVD."""
    out = check_output(out, [p for p, _ in loras], force)
    model = load_base(base)
    files = [(read_lora(model, p), w) for p, w in loras]
    keys = list(dict.fromkeys(k for f, _ in files for k in f.modules))
    modules, kept = {}, {}
    for key in progress(keys, "mix"):
        parts = [(*f.modules[key], w) for f, w in files if key in f.modules]
        a, b = linalg.concatenate(parts)
        if rank:
            a, b, kept[key] = linalg.factor(linalg.delta(a, b, 1.0), rank=rank)
        modules[key] = (a, b)
    path = _write(model, modules, out, output_layout(model, layout, [f for f, _ in files]), [f for f, _ in files],
                  {"ss_mixed_from": json.dumps([f"{p.name}:{w:g}" for p, w in loras])})
    return {"output": str(path), "modules": len(modules), "ranks": _rank_summary(modules),
            **({"min_kept_energy": round(min(kept.values()), 6)} if kept else {})}


@torch.no_grad()
def resize(base: str, lora: Path, out: Path, rank: int = 0, energy: float = 0.0, layout: str = "auto",
           force: bool = False) -> dict:
    """SVD rank reduction: a fixed rank, or per module the fewest ranks keeping `energy` of Σσ²."""
    if bool(rank) == bool(energy):
        raise ConfigError("resize: give --rank R or --energy F (0 < F ≤ 1)")
    out = check_output(out, [lora], force)
    model = load_base(base)
    from .updates import open_updates
    updates = open_updates(model, lora)   # a DoRA/LoHa/LoKr file becomes a LoRA: the SVD of its ΔW
    f = updates.lora
    modules, kept = {}, {}
    for key, update in progress(updates.at(1.0), "resize", total=updates.layers):
        a2, b2, kept[f"{key[0]}.{key[1]}"] = linalg.factor(update, rank=rank or None, energy=energy or None)
        modules[key] = (a2, b2)
    inputs = [f] if f else []
    extra = {"ss_resized_from": lora.name, "ss_resize": f"rank {rank}" if rank else f"energy {energy}"}
    if f is None:
        from .files import read_safetensors
        from ..methods.variants import METADATA_KEY
        meta = {k: v for k, v in read_safetensors(lora)[1].items() if k != METADATA_KEY and not k.startswith("ss_network")}
        extra = {**meta, **extra, "ss_converted_from": updates.kind, "ss_network_module": "networks.lora"}
    path = _write(model, modules, out, output_layout(model, layout, inputs), inputs, extra)
    return {"output": str(path), "modules": len(modules), "ranks": _rank_summary(modules),
            "kept_energy": {k: round(v, 6) for k, v in kept.items()}}


def _matches(path: str, targets) -> bool:
    return any(path == t or path.endswith("." + t) for t in targets)


@torch.no_grad()
def extract(base: str, tuned: str, out: Path, rank: int, conv_rank: int = 0, layout: str = "auto",
            force: bool = False) -> dict:
    """A LoRA from a full fine-tune: per adapted layer the SVD of tuned − base (convolutions, with
    conv_rank > 0, as LoCon). The family's adapter targets (and its text encoders' attention) are
    extracted; what changed elsewhere is reported, not silently lost."""
    from ..config.schema import TrainConfig
    out = check_output(out, [Path(base), Path(tuned)], force)
    a_model, t_model = load_base(base), load_base(tuned)
    if a_model.family.name != t_model.family.name:
        raise ConfigError(f"--tuned {tuned}: a {t_model.family.label} model, the base is {a_model.family.label}")
    family, net = a_model.family, TrainConfig().network
    targets = {family.denoiser_name: family.default_targets or tuple(net.target_modules),
               **{name: tuple(net.text_encoder_target_modules) for name in family.trainable_text_encoders()}}
    tuned_mods, modules, kept, lost, total = components(t_model), {}, {}, [], 0.0
    for component, module in components(a_model).items():
        other = dict(tuned_mods[component].named_parameters())
        for name, layer in progress(list(module.named_modules()), f"extract {component}"):
            weight = getattr(layer, "weight", None)
            if not isinstance(layer, (torch.nn.Linear, torch.nn.Conv2d)) or f"{name}.weight" not in other:
                continue
            diff = other[f"{name}.weight"].float() - weight.float()
            if tuple(diff.shape) != tuple(weight.shape):
                raise ConfigError(f"--tuned {tuned}: {component} {name} is {tuple(diff.shape)}, the base's "
                                  f"{tuple(weight.shape)} (another variant?)")
            size = float(diff.pow(2).sum())
            total += size
            if size == 0:
                continue
            conv = isinstance(layer, torch.nn.Conv2d)
            if (conv and conv_rank <= 0) or (not conv and not _matches(name, targets.get(component, ()))):
                lost.append((size, f"{component}.{name}"))
                continue
            a, b, kept[f"{component}.{name}"] = linalg.factor(diff, rank=conv_rank if conv else rank)
            modules[(component, name)] = (a, b)
    if not modules:
        raise ConfigError(f"--tuned {tuned}: no adapted layer differs from the base; nothing to extract")
    meta = {**family.lora_metadata(), "ss_extracted_from": Path(tuned).name, "ss_network_module": "networks.lora"}
    path = write_lora(a_model, modules, out, output_layout(a_model, layout, []), meta)
    lost_share = sum(s for s, _ in lost) / total if total else 0.0
    return {"output": str(path), "modules": len(modules), "ranks": _rank_summary(modules),
            "min_kept_energy": round(min(kept.values()), 6),
            "changed_elsewhere": {"share_of_change": round(lost_share, 6),
                                  "layers": [n for _, n in sorted(lost, reverse=True)[:5]]}}


@torch.no_grad()
def post_hoc_ema(run_dir: Path, sigma_rels: list[float], out: Path, base: str = "", force: bool = False) -> dict:
    """Karras et al. 2024's post-hoc EMA over a run's saved checkpoints (linalg.ema_weights): one file per
    σ_rel, `<out>` (one value) or `<out stem>-sigma<σ>.safetensors`."""
    from safetensors.torch import load_file
    from ..config import load_config
    from ..methods.lora import adapter_config, alpha_for_module
    from ..methods.variants import has_kohya_format, network_metadata, save_peft_file
    from ..run.checkpoint_files import list_checkpoints, step_of
    from ..run.contract import CONFIG_FILE
    run_dir = Path(run_dir)
    cfg = load_config(str(run_dir / CONFIG_FILE)) if (run_dir / CONFIG_FILE).is_file() else None
    if cfg is None:
        raise ConfigError(f"--run {run_dir}: no {CONFIG_FILE}; not a run folder")
    if cfg.network.type not in ("lora", "loha", "lokr"):
        raise ConfigError(f"--run {run_dir}: network.type {cfg.network.type}; post-hoc EMA averages adapter "
                          "checkpoints (lora, loha, lokr, DoRA)")
    saved = list_checkpoints(run_dir)
    if len(saved) < 2:
        raise ConfigError(f"--run {run_dir}: {len(saved)} complete checkpoint(s); post-hoc EMA needs at least 2 "
                          "(checkpoints.every_n_steps, keep_last)")
    steps = [step_of(p) for p in saved]
    outs = [Path(out)] if len(sigma_rels) == 1 else \
        [Path(out).with_name(f"{Path(out).stem}-sigma{s:g}.safetensors") for s in sigma_rels]
    for o in outs:
        check_output(o, [*saved], force)
    model = load_base(base or cfg.model.path)
    names = [p.name for p in sorted(saved[0].glob("adapter_*.safetensors"))]
    if not names:
        raise ConfigError(f"{saved[0]}: no adapter_*.safetensors; not a LoRA checkpoint")
    states = [{n: load_file(str(p / n)) for n in names} for p in progress(saved, "read checkpoints")]
    results = []
    for sigma, o in zip(sigma_rels, outs):
        weights = linalg.ema_weights(steps, sigma)
        averaged = {n.removeprefix("adapter_").removesuffix(".safetensors"):
                    {k: sum(w * s[n][k].float() for w, s in zip(weights, states)) for k in states[-1][n]}
                    for n in names}
        from ..methods.kohya_format import save_lora_file
        meta = {**model.family.lora_metadata(), "ss_network_dim": str(cfg.network.rank),
                "ss_network_alpha": str(cfg.network.alpha), "ss_output_name": cfg.output.name,
                "ss_steps": str(steps[-1]), "ss_post_hoc_ema": json.dumps({"sigma_rel": sigma, "steps": steps,
                                                                          "weights": [round(w, 6) for w in weights]})}
        if has_kohya_format(cfg):
            path = save_lora_file(check_output(o, [*saved], force), model, averaged, alpha=alpha_for_module(cfg),
                                  metadata=meta, layout=cfg.output.lora_format)
        else:   # DoRA, LoHa, LoKr: their parameters averaged (as an EMA in training does), the trainer's layout
            path = save_peft_file(check_output(o, [*saved], force), averaged,
                                  {name: adapter_config(cfg, name) for name in averaged},
                                  {**meta, **network_metadata(cfg)})
        results.append({"output": str(path), "sigma_rel": sigma, "weights": dict(zip(steps, weights))})
    return {"checkpoints": steps, "outputs": results}


def _rank_summary(modules: dict) -> dict[str, int]:
    """rank -> how many modules have it."""
    counts: dict[str, int] = {}
    for a, _ in modules.values():
        counts[str(a.shape[0])] = counts.get(str(a.shape[0]), 0) + 1
    return counts
