"""The arithmetic of the LoRA tools, pure (tensors in, tensors out; property-tested).

A LoRA module is (A, B, scale): A = lora_A / lora_down, [r, in] or a convolution's [r, in, kh, kw];
B = lora_B / lora_up, [out, r] or [out, r, 1, 1]; scale = alpha / r. Its update of the base weight is
ΔW = scale · B·A, shaped like the weight ([out, in] or [out, in, kh, kw]).
"""
from __future__ import annotations

import math

import torch


def delta(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """ΔW = scale · B·A in fp32, shaped like the base weight."""
    return (b.flatten(1).float() @ a.flatten(1).float() * scale).reshape(b.shape[0], *a.shape[1:])


def factor(update: torch.Tensor, rank: int | None = None, energy: float | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(A, B, kept) with B·A the best rank-r approximation of `update` (truncated SVD; scale 1, so
    alpha = r). r = `rank` (at most the matrix's), or the fewest singular values whose squares keep
    `energy` of the total. kept: the fraction of Σσ² kept = 1 − ||update − B·A||² / ||update||²."""
    if (rank is None) == (energy is None):
        raise ValueError("give rank or energy")
    m = update.flatten(1).float()
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    power = s.double() ** 2
    total = float(power.sum())
    if energy is not None:
        cumulative = torch.cumsum(power, 0) / total if total > 0 else torch.ones_like(power)
        r = int((cumulative < energy - 1e-12).sum()) + 1
    else:
        r = rank
    r = max(1, min(r, s.numel()))
    root = s[:r].sqrt()
    b = u[:, :r] * root
    a = root[:, None] * vh[:r]
    kept = float(power[:r].sum() / total) if total > 0 else 1.0
    a = a.reshape(r, *update.shape[1:])
    b = b.reshape(update.shape[0], r, *([1] * (update.ndim - 2)))
    return a.contiguous(), b.contiguous(), kept


def concatenate(parts: list[tuple[torch.Tensor, torch.Tensor, float, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Several LoRAs on one module as one, exactly: parts are (A, B, scale, weight); the result's
    B·A (scale 1) = Σ weight · scale · B·A, its rank the sum of theirs."""
    a = torch.cat([p[0].float() for p in parts], 0)
    b = torch.cat([p[1].float() * (p[2] * p[3]) for p in parts], 1)
    return a, b


def sigma_rel_to_gamma(sigma_rel: float) -> float:
    """The power-function EMA exponent γ of a relative standard deviation σ_rel (Karras et al. 2024,
    "Analyzing and Improving the Training Dynamics of Diffusion Models", eq. 3: σ_rel² = (γ+1) /
    ((γ+2)² (γ+3))): the largest real root of γ³ + 7γ² + (16 − σ_rel⁻²)γ + (12 − σ_rel⁻²)."""
    if not 0 < sigma_rel < 0.2887:  # γ → 0 gives σ_rel = 1/√12: the plain average of the whole run
        raise ValueError(f"sigma_rel must be in (0, 0.288), got {sigma_rel}")
    t = sigma_rel ** -2
    import numpy as np
    roots = np.roots([1.0, 7.0, 16.0 - t, 12.0 - t])
    return float(max(r.real for r in roots if abs(r.imag) < 1e-9))


def ema_weights(steps: list[int], sigma_rel: float) -> list[float]:
    """The weight of each saved snapshot in the power-function EMA at the last step T = steps[-1]: the
    EMA's profile p(t) ∝ t^γ on [0, T], where snapshot i stands for the steps since the one before it
    (its weights are the run's from step steps[i-1] to steps[i]): w_i = (t_i^(γ+1) − t_(i−1)^(γ+1)) / T^(γ+1).
    Weights are positive and sum to 1; a larger σ_rel spreads them back over earlier snapshots."""
    if not steps or any(b <= a for a, b in zip(steps, steps[1:])) or steps[0] <= 0:
        raise ValueError(f"steps must be positive and increasing, got {steps}")
    g = sigma_rel_to_gamma(sigma_rel) + 1.0
    total = steps[-1]
    edges = [0.0, *[s / total for s in steps]]  # relative times: no overflow of t^(γ+1) for long runs
    return [math.pow(hi, g) - math.pow(lo, g) for lo, hi in zip(edges, edges[1:])]
