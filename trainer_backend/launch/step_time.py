"""A rough step-time estimate before launch: a fixed overhead per step plus the denoiser's FLOPs per step
divided by a card's dense bf16 tensor throughput times an efficiency, both fitted on every GPU run the
project measured (H100 and H200).

FLOPs come from assets/memory_tables.json (`flops`, written by tools/make_memory_tables.py --flops-only:
torch.utils.flop_counter on the full-size model on the meta device, so matmuls, convolutions and
attention only). Pure (no torch). See docs/memory.md, "Step time", for the calibration and its error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Published dense (no sparsity) bf16/fp16 tensor TFLOPS with fp32 accumulation, which is what a bf16
# matmul in PyTorch uses. Sources: NVIDIA's Ampere GA102 and Ada Lovelace whitepapers (GeForce cards run
# fp32-accumulate at half their fp16-accumulate rate: RTX 3090 71, RTX 4090 165.2, RTX 4060 Ti 44.2;
# the RTX 3060 is not in the GA102 paper: 25.6, its 51.2 fp16-accumulate figure halved), the RTX A6000,
# L40S, A100, H100 (SXM, PCIe, NVL) and H200 datasheets (sparsity figures halved).
CARD_TFLOPS = {
    "RTX 3060": 25.6,
    "RTX 4060 Ti": 44.2,
    "RTX 3090": 71.0,
    "RTX 4090": 165.2,
    "RTX A6000": 154.8,
    "L40S": 362.05,
    "A100": 312.0,
    "H100": 989.4,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H200": 989.4,     # the H100 SXM's tensor cores with more, faster memory
}
REFERENCE_CARD = "RTX 4090"

# A step = OVERHEAD_S + FLOPs / (card peak × EFFICIENCY): a fixed cost per optimizer step (kernel launches,
# the optimizer, the data and the host's Python, which a FLOP count does not see and which dominates small
# steps) plus the FLOPs at a fraction of the card's dense bf16 peak. Both fitted (`fit`, least squares of
# the relative error) on every GPU measurement in the repo: bench/measured_h100.json, bench/measured_h200.json
# and bench/measured-h200-2026-11-27 (bench/step_time_fit.py prints the fit; docs/memory.md, "Step time";
# tests/test_step_time.py recomputes it).
OVERHEAD_S = 0.381
EFFICIENCY = 0.2657
# the largest factor between the estimate and a measured point (s/step), both ways, over those runs; the
# published consumer-card figures (SimpleTuner, Flux.1 NF4 on an RTX 4090) are within it too (docs/memory.md)
FIT_ERROR = 3.1


def card_for(name: str) -> str | None:
    """The table's card for a device name as NVML or torch reports it ("NVIDIA GeForce RTX 4090")."""
    low = (name or "").lower()
    for card in sorted(CARD_TFLOPS, key=len, reverse=True):  # "RTX 4060 Ti" before a bare "RTX 4060"
        if card.lower() in low:
            return card
    return None


def step_flops(table: dict, *, pixels: int, batch: int, full: bool, checkpointing: bool,
               latents_cached: bool = True) -> float | None:
    """FLOPs of one training step (one batch), or None where the table has no FLOP count.
    Forward = 1; backward to the activations ≈ 1 (grad-input matmuls); the weights' gradients ≈ 1 more
    for a full fine-tune (the usual 3× of forward), ~0 for an adapter; checkpointing recomputes the
    forward once more. The VAE encode counts when latents are not cached; text encoders never (cached,
    or a small share next to the denoiser: docs/memory.md)."""
    flops = table.get("flops")
    if not flops:
        return None
    smallest = (min(flops.get("sides", [0])) // table.get("vae_scale_factor", 8)) ** 2
    passes = (3 if full else 2) + (1 if checkpointing else 0)
    total = _per_sample(flops["denoiser_forward"], pixels, smallest) * batch * passes
    if not latents_cached and flops.get("vae_encode"):
        total += _per_sample(flops["vae_encode"], pixels, smallest) * batch
    return total


def _per_sample(line: list[float], pixels: int, smallest: int) -> float:
    """The line a + b × pixels; below the smaller counted size (where the line's negative intercept,
    from attention growing faster than the pixels, would reach zero) in proportion to that size's count."""
    a, b = line
    if smallest and pixels < smallest:
        return max(a + b * smallest, 0.0) * pixels / smallest
    return max(a + b * pixels, 0.0)


def seconds(flops: float, tflops: float, efficiency: float = EFFICIENCY, overhead: float = OVERHEAD_S) -> float:
    """One step: the fixed overhead plus the FLOPs at `efficiency` of the card's peak."""
    return overhead + flops / (tflops * 1e12 * efficiency)


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(overhead s, efficiency) of `seconds` that best fit the measured (FLOPs / peak FLOP/s, s/step) points:
    weighted least squares of the relative error (each point's residual over its measured time), closed
    form; the overhead is held at 0 when the free fit would make it (or the FLOP term) negative."""
    if len(points) < 2:
        raise ValueError("two measured points at least")
    w = [1 / t ** 2 for _, t in points]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, points))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, points))
    st = sum(wi * t for wi, (_, t) in zip(w, points))
    sxt = sum(wi * x * t for wi, (x, t) in zip(w, points))
    det = sw * sxx - sx * sx
    overhead = (st * sxx - sx * sxt) / det if det > 0 else -1.0
    slope = (sw * sxt - sx * st) / det if det > 0 else 0.0
    if overhead < 0 or slope <= 0:   # points that no positive overhead and efficiency fit: the FLOP term alone
        return 0.0, sxx / sxt
    return overhead, 1 / slope


def duration(total_s: float) -> str:
    """'1 h 10 min', '12 min', '40 s'."""
    if total_s < 90:
        return f"{total_s:.0f} s"
    minutes = round(total_s / 60)
    if minutes < 60:
        return f"{minutes} min"
    h, m = divmod(minutes, 60)
    return f"{h} h {m} min" if m else f"{h} h"


@dataclass
class StepTime:
    card: str
    detected: bool          # the card is the one this machine has (else the reference card)
    seconds: float
    steps: int              # optimizer steps planned (0: unknown, e.g. epochs over an unscanned dataset)
    grad_accum: int

    def line(self) -> str:
        # every card in the table reads with "an" (an RTX…, an A100, an H100, an L40S)
        which = "" if self.detected else "reference card; "
        text = (f"Step time ≈ {self.seconds:.2g} s on an {self.card} ({which}rough: overhead + FLOPs at an "
                f"efficiency fitted on H100/H200 runs, measured points within ×{FIT_ERROR:g})")
        if self.steps:
            total = self.seconds * self.grad_accum * self.steps
            text += f"; {self.steps} steps ≈ {duration(total)}"
        return text + "."


def estimate(table: dict, *, pixels: int, batch: int, full: bool, checkpointing: bool, latents_cached: bool,
             card_name: str = "", steps: int = 0, grad_accum: int = 1) -> StepTime | None:
    """The step-time estimate for the named card (the reference card where the name is unknown)."""
    flops = step_flops(table, pixels=pixels, batch=batch, full=full, checkpointing=checkpointing,
                       latents_cached=latents_cached)
    if flops is None:
        return None
    card = card_for(card_name)
    detected = card is not None
    card = card or REFERENCE_CARD
    return StepTime(card, detected, seconds(flops, CARD_TFLOPS[card]), steps, max(grad_accum, 1))


def calibrate(table_for, measured: list[dict]) -> tuple[float, float, list[tuple[str, float, float]]]:
    """(overhead s, efficiency, per run (name, measured s/step, estimated s/step)) fitted on measured runs:
    each a dict with arch, resolution, sets, it_s and card (bench/step_time_fit.py gathers them); `table_for(arch)`
    gives a family's table."""
    points = [(_case_flops(table_for(c["arch"]), c) / (CARD_TFLOPS[c["card"]] * 1e12), 1 / c["it_s"]) for c in measured]
    overhead, eff = fit(points)
    return overhead, eff, [(c["name"], t, overhead + x / eff) for c, (x, t) in zip(measured, points)]


def case_it_s(table: dict, case: dict, card: str) -> float:
    """The estimate's steps a second for a measured bench case (arch, resolution, sets) on a table card."""
    return 1 / seconds(_case_flops(table, case), CARD_TFLOPS[card])


def _case_flops(table: dict, case: dict) -> float:
    sets = case.get("sets", {})
    scale = table["vae_scale_factor"]
    side = case["resolution"] // scale
    # the bench encodes latents every step unless the case caches them (bench/measured_h100.json's command)
    return step_flops(table, pixels=side * side, batch=case.get("batch", 1), full=sets.get("network.type") == "full",
                      checkpointing=bool(sets.get("precision.gradient_checkpointing")),
                      latents_cached=bool(sets.get("dataset.cache_latents")))
