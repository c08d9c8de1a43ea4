"""The memory plan in words: a verdict per card, the options that would make a config fit, and the
text the CLI `plan` and the studio show. Pure (no torch); the card is hardware.gpu_memory_gb, or the
one NVML reports, or every common size.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .memory_plan import CARDS_GB, MemoryPlan, has_option, opt, plan_memory
from .memory_tables import family_table, pipeline_outside_table
from .model_size import planning_arch

VERDICT_MARK = {"fits": "✅ fits", "tight": "⚠️ tight", "will not fit": "❌ will not fit"}


@lru_cache(maxsize=1)
def detect_card_gb() -> float:
    """Memory of the smallest visible NVIDIA GPU in GB (GiB), 0 where there is none or no driver."""
    try:
        import pynvml
        pynvml.nvmlInit()
        sizes = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total / 2 ** 30
                 for i in range(pynvml.nvmlDeviceGetCount())]
        return round(min(sizes), 1) if sizes else 0.0
    except Exception:  # no driver (NVMLError_LibraryNotFound), no package, no GPU
        return 0.0


@lru_cache(maxsize=1)
def detect_card_name() -> str:
    """The first visible NVIDIA GPU's name ("NVIDIA GeForce RTX 4090"), "" where there is none."""
    try:
        import pynvml
        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no driver, no package, no GPU
        return ""


def step_time_line(cfg, arch: str, plan: MemoryPlan, card_name: str | None = None, steps: int | None = None) -> str:
    """The step-time estimate (launch/step_time.py) on this machine's card when the plan is for it
    (hardware.gpu_memory_gb unset), else on the reference card; the run's length for `steps` optimizer
    steps (the step plan's total; schedule.max_steps when not given, none when that is 0)."""
    from .step_time import estimate
    from .model_size import sized_table
    table = sized_table(arch, cfg.model.path)
    if card_name is None:
        card_name = "" if float(opt(cfg, "hardware.gpu_memory_gb", 0) or 0) > 0 else detect_card_name()
    scale = table["vae_scale_factor"]
    w, h = plan.side
    est = estimate(table, pixels=(w // scale) * (h // scale) * plan.latent_frames, batch=cfg.schedule.batch_size,
                   full=opt(cfg, "network.type", "lora") == "full",
                   checkpointing=bool(opt(cfg, "precision.gradient_checkpointing", False)),
                   latents_cached=bool(opt(cfg, "dataset.cache_latents", True)), card_name=card_name,
                   steps=int(opt(cfg, "schedule.max_steps", 0) or 0) if steps is None else steps, grad_accum=int(opt(cfg, "schedule.grad_accum", 1)))
    if est is None:
        return f"Step time: unknown (no FLOP count for {arch!r}: tools/make_memory_tables.py --flops-only)."
    return est.line()


def target_card(cfg, detected: float | None = None) -> float:
    """hardware.gpu_memory_gb, else the detected card, else 0 (unknown: every common size is shown)."""
    chosen = float(opt(cfg, "hardware.gpu_memory_gb", 0) or 0)
    if chosen > 0:
        return chosen
    return detect_card_gb() if detected is None else detected


def _with(cfg, changes: dict):
    """A copy of cfg with dotted keys set; None when an option does not exist in this build or the
    change breaks a rule of config/rules.py (e.g. a quantized base in a full fine-tune)."""
    from ..config import rules
    new = cfg.model_copy(deep=True)
    for dotted, value in changes.items():
        if not has_option(cfg, dotted):
            return None
        section, key = dotted.split(".")
        try:
            setattr(getattr(new, section), key, value)
        except ValueError:  # out of the field's bounds or choices
            return None
    before = set(rules.problems(cfg))
    return None if any(p not in before for p in rules.problems(new)) else new


def candidate_changes(cfg) -> list[tuple[str, dict]]:
    """Options that lower the peak, in the order worth trying (only options this build has)."""
    out: list[tuple[str, dict]] = []
    full = cfg.network.type == "full"
    if not cfg.precision.gradient_checkpointing:
        out.append(("gradient checkpointing", {"precision.gradient_checkpointing": True}))
    cache = {}
    if not cfg.dataset.cache_latents:
        cache["dataset.cache_latents"] = True
    if not cfg.dataset.cache_text_encoder_outputs and not cfg.network.train_text_encoder:
        cache["dataset.cache_text_encoder_outputs"] = True
    if has_option(cfg, "memory.offload_encoders") and not opt(cfg, "memory.offload_encoders", False):
        cache["memory.offload_encoders"] = True
    if cache:
        out.append(("cached latents and text, encoders off the GPU", cache))
    if cfg.optimizer.name in ("adamw", "prodigy", "lion"):
        out.append(("8-bit AdamW", {"optimizer.name": "adamw8bit"}))
    if full and not (cfg.precision.full_bf16 or cfg.precision.full_fp16) and cfg.precision.mixed == "bf16":
        out.append(("bf16 weights without fp32 masters", {"precision.full_bf16": True}))
    if full and has_option(cfg, "optimizer.fused_backward") and not opt(cfg, "optimizer.fused_backward"):
        if cfg.schedule.grad_accum == 1:
            out.append(("fused backward pass", {"optimizer.fused_backward": True}))
    if not full and has_option(cfg, "model.quantize"):
        for q in ("int8", "nf4"):
            if opt(cfg, "model.quantize", "none") in ("none", "int8") and q != opt(cfg, "model.quantize"):
                out.append((f"{q} base weights", {"model.quantize": q}))
        if opt(cfg, "model.quantize_text_encoders", "none") == "none" and not cfg.dataset.cache_text_encoder_outputs:
            out.append(("int8 text encoders", {"model.quantize_text_encoders": "int8"}))
    if cfg.schedule.batch_size > 1:
        out.append(("batch 1 with accumulation", {"schedule.batch_size": 1,
                                                  "schedule.grad_accum": cfg.schedule.grad_accum * cfg.schedule.batch_size}))
    if has_option(cfg, "memory.block_swap"):
        for n in (4, 8, 16, 24, 32):
            out.append((f"block swap {n}", {"memory.block_swap": n}))
    return out


def fixes(cfg, arch: str, card_gb: float, buckets=None, limit: int = 4) -> list[str]:
    """What would make cfg fit `card_gb`: single changes that suffice, else one combination found by
    adding the changes in order. Each item names the keys, e.g. "gradient checkpointing
    (precision.gradient_checkpointing = true) → 9.8 GiB"."""
    singles, combined, current = [], {}, cfg
    for label, changes in candidate_changes(cfg):
        trial = _with(cfg, changes)
        plan = trial and plan_memory(trial, arch, buckets)
        if plan and plan.verdict(card_gb) == "fits":
            if not (label.startswith("block swap") and any(s.startswith("block swap") for s in singles)):
                singles.append(f"{label} ({_keys(changes)}) → {plan.needed_gib():.1f} GiB")
    if singles:
        return singles[:limit]
    for label, changes in candidate_changes(cfg):
        trial = {**combined, **changes}
        current = _with(cfg, trial)
        if current is None:   # refused together with what is already chosen: leave it out
            continue
        combined = trial
        plan = plan_memory(current, arch, buckets)
        if plan and plan.verdict(card_gb) == "fits":
            return [f"all of: {_keys(combined)} → {plan.needed_gib():.1f} GiB"]
    return []


def _keys(changes: dict) -> str:
    return ", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items())


def card_lines(plan: MemoryPlan, card_gb: float) -> list[tuple[float, str]]:
    cards = [card_gb] if card_gb else list(CARDS_GB)
    return [(c, plan.verdict(c)) for c in cards]


def why_no_plan(cfg, arch: str) -> str:
    if arch == "auto":
        return "set model.arch"
    table = family_table(arch)
    other = table and pipeline_outside_table(table, cfg.model.path)
    if other:
        return f"no memory table for {other} models: the {arch!r} table describes {table.get('note') or 'another size'}"
    return f"no memory table for {arch!r} (tools/make_memory_tables.py)"


def memory_lines(cfg, arch: str | None = None, buckets=None, card_gb: float | None = None,
                 markdown: bool = False, steps: int | None = None) -> list[str]:
    """The memory section of the plan, as lines of text (or markdown), ending with the step time
    (`steps`: the run's optimizer steps, for its length)."""
    arch = arch or planning_arch(cfg)
    plan = plan_memory(cfg, arch, buckets)
    if plan is None:
        return [f"Memory: unknown ({why_no_plan(cfg, arch)})."]
    card = target_card(cfg) if card_gb is None else card_gb
    b = "**" if markdown else ""
    w, h = plan.side
    lines = [f"{b}Peak GPU memory: {size_text(plan.peak_bytes)}{b} allocated ({plan.peak_phase}, batch "
             f"{cfg.schedule.batch_size} at {w}×{h}); a card needs about {plan.needed_gib():.1f} GiB "
             f"with the CUDA context and allocator slack."]
    lines += phase_lines(plan)
    verdicts = card_lines(plan, card)
    label = "this card" if card else "cards"
    lines.append(f"{label.capitalize()}: " + "; ".join(f"{c:g} GB {VERDICT_MARK[v]}" for c, v in verdicts))
    worst = next((c for c, v in verdicts if v != "fits"), 0)
    if card and verdicts[0][1] != "fits" or not card and worst:
        target = card or worst
        found = fixes(cfg, arch, target, buckets)
        if found:
            lines.append(f"To fit {target:g} GB: " + "; ".join(found) + ".")
        else:
            presets = fitting_presets(cfg, arch, target)
            lines.append(f"No option here makes it fit {target:g} GB" + (
                f"; the preset {' or '.join(presets)} is planned for it (load it from Presets, then set your "
                f"paths again)." if presets else "."))
    lines.append(step_time_line(cfg, arch, plan, steps=steps))
    lines += [f"Note: {n}." for n in plan.notes]
    return lines


def size_text(nbytes: float) -> str:
    """Bytes for people: GiB from 1 GiB up (0.1 steps), MiB below (a tiny model's plan is megabytes)."""
    if nbytes >= 2 ** 30:
        return f"{nbytes / 2 ** 30:.1f} GiB"
    mib = nbytes / 2 ** 20
    return f"{mib:.0f} MiB" if mib >= 10 else f"{mib:.1f} MiB"


PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"


def fitting_presets(cfg, arch: str, card_gb: float, presets_dir: Path = PRESETS_DIR, limit: int = 2) -> list[str]:
    """The built-in presets of this family the planner says fit `card_gb` when they train this config's
    model (its model.path, when set), the largest plan first (the most the card allows):
    ["flux-dev-lora-8gb (7.2 GiB)"]. Presets of a builtin tiny model (the demos) are left out."""
    from ..config import load_config
    found = []
    for path in sorted(Path(presets_dir).glob("*.toml")):
        try:
            preset = load_config(path)
        except Exception:  # a broken preset file is the presets page's to report
            continue
        if preset.model.path.startswith("builtin:") or planning_arch(preset) != arch:
            continue
        if cfg.model.path:
            preset.model.path = cfg.model.path
        plan = plan_memory(preset, arch)
        if plan is not None and plan.verdict(card_gb) == "fits":
            found.append((plan.needed_gib(), f"{path.stem} ({plan.needed_gib():.1f} GiB)"))
    return [text for _, text in sorted(found, reverse=True)[:limit]]


def phase_lines(plan: MemoryPlan) -> list[str]:
    """The breakdown: the cache pass (before the denoiser is placed), then the training step's phases
    on top of what stays on the GPU while training. The peak is the largest total (marked)."""
    unit, scale = ("GiB", 2 ** 30) if plan.peak_bytes >= 2 ** 30 else ("MiB", 2 ** 20)

    def gib(value: float) -> str:
        return f"{value / scale:.2f}"

    def mark(phase: str) -> str:
        return " ◀ peak" if phase == plan.peak_phase else ""

    totals = plan.phase_totals()
    lines = []
    for name, parts in plan.cache_phases.items():
        held = ", ".join(f"{k} {gib(v)}" for k, v in parts.items() if v)
        lines.append(f"Cache pass, {name} ({unit}, before the denoiser is on the GPU): {held}; "
                     f"total {gib(totals[name])}{mark(name)}.")
    held = ", ".join(f"{k} {gib(v)}" for k, v in plan.resident.items() if v)
    lines.append(f"Training, always on the GPU ({unit}): {held}.")
    steps = "; ".join(f"{k} +{gib(v)} = {gib(totals[k])}{mark(k)}" for k, v in plan.phases.items())
    lines.append(f"Training step phases ({unit}): {steps}.")
    return lines


def will_not_fit(cfg, arch: str | None = None, buckets=None, card_gb: float | None = None) -> str:
    """One line for the studio's Start warning when the config will not fit the (detected or chosen)
    card; "" when it fits, is only tight, or nothing is known."""
    arch = arch or planning_arch(cfg)
    card = target_card(cfg) if card_gb is None else card_gb
    plan = plan_memory(cfg, arch, buckets) if card else None
    if plan is None or plan.verdict(card) != "will not fit":
        return ""
    found = fixes(cfg, arch, card, buckets, limit=2)
    hint = f" Try: {'; '.join(found)}." if found else ""
    return (f"This run needs about {plan.needed_gib():.1f} GiB of GPU memory; the card has {card:g} GB, "
            f"so it will run out of memory.{hint}")


def memory_report(cfg, arch: str | None = None, buckets=None, card_gb: float | None = None,
                  steps: int | None = None) -> dict | None:
    """The memory plan as JSON (the CLI's `plan --json`): the plan, the card and its verdict, the fixes,
    the step-time line."""
    arch = arch or planning_arch(cfg)
    plan = plan_memory(cfg, arch, buckets)
    if plan is None:
        return None
    card = target_card(cfg) if card_gb is None else card_gb
    verdicts = card_lines(plan, card)
    failing = [c for c, v in verdicts if v != "fits"]
    return {**plan.to_dict(), "card_gb": card, "verdicts": {f"{c:g}": v for c, v in verdicts},
            "fixes": fixes(cfg, arch, failing[0], buckets) if failing else [],
            "step_time": step_time_line(cfg, arch, plan, steps=steps)}
