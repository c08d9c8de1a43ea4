"""A rough step-time estimate before launch: the denoiser's FLOPs per step divided by a card's dense
bf16 tensor throughput times one efficiency factor calibrated on our measured H100 runs.

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

# Fraction of the card's dense bf16 peak our steps reach: the geometric mean of achieved/peak over the
# measured H100 runs in bench/measured_h100.json (docs/memory.md, "Step time"; tests/test_step_time.py
# recomputes it). Elementwise ops, norms, launch overhead and the optimizer are in it, not in the FLOPs.
EFFICIENCY = 0.0165
# the largest factor between the calibrated estimate and a measured point (it/s), both ways: 2.04 over the H100
# runs; the H200 runs of bench/measured-h200-2026-11-27 (same tensor peak, a faster host for these CPU-bound
# steps) ran 1.16–2.20× faster than the estimate
FIT_ERROR = 2.2


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


def seconds(flops: float, tflops: float, efficiency: float = EFFICIENCY) -> float:
    return flops / (tflops * 1e12 * efficiency)


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
        text = (f"Step time ≈ {self.seconds:.2g} s on an {self.card} ({which}rough: FLOPs on the meta device, "
                f"efficiency calibrated on H100 runs, measured points within ×{FIT_ERROR:g})")
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


def calibrate(table_for, measured: list[dict]) -> tuple[float, list[tuple[str, float, float]]]:
    """Efficiency = geometric mean over the measured runs of achieved/peak FLOP rate on the H100, and per
    run (name, measured it/s, estimated it/s). `table_for(arch)` gives a family's table; a run's dict is
    bench/measured_h100.json's case (arch, resolution, sets, it_s)."""
    ratios, runs = [], []
    for case in measured:
        flops = _case_flops(table_for(case["arch"]), case)
        ratios.append(flops * case["it_s"] / (CARD_TFLOPS["H100"] * 1e12))
        runs.append((case, flops))
    eff = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return eff, [(c["name"], c["it_s"], 1 / seconds(f, CARD_TFLOPS["H100"], eff)) for c, f in runs]


def case_it_s(table: dict, case: dict, card: str, efficiency: float = EFFICIENCY) -> float:
    """The estimate's steps a second for a measured bench case (arch, resolution, sets) on a table card."""
    return 1 / seconds(_case_flops(table, case), CARD_TFLOPS[card], efficiency)


def _case_flops(table: dict, case: dict) -> float:
    sets = case.get("sets", {})
    scale = table["vae_scale_factor"]
    side = case["resolution"] // scale
    # the bench encodes latents every step and caches the text (bench/measured_h100.json's command)
    return step_flops(table, pixels=side * side, batch=1, full=sets.get("network.type") == "full",
                      checkpointing=bool(sets.get("precision.gradient_checkpointing")), latents_cached=False)
