"""Wan 2.2's two experts: which one denoises a timestep, and the range each one is trained over.

Wan 2.2 T2V/I2V 14B ship two transformers: `transformer` (high noise) runs while the timestep is at or
above `boundary_ratio * num_train_timesteps`, `transformer_2` (low noise) below it (diffusers'
WanPipeline makes the same split). Training one expert means sampling timesteps only from its range;
training both means each step's timestep picks the expert it trains. TI2V 5B has one transformer
(boundary_ratio None: the whole range).
"""
from __future__ import annotations

EXPERT_CHOICES = ("high", "low", "both")


def boundary_timestep(boundary_ratio: float | None, num_train_timesteps: int = 1000) -> float | None:
    """The timestep where the low-noise expert takes over (None: a single transformer)."""
    if boundary_ratio is None:
        return None
    if not 0.0 < boundary_ratio < 1.0:
        raise ValueError(f"boundary_ratio must be between 0 and 1, got {boundary_ratio}")
    return boundary_ratio * num_train_timesteps


def expert_of(timestep: float, boundary: float | None) -> str:
    """'high' (transformer) or 'low' (transformer_2) for a timestep, as the pipeline chooses at sampling."""
    if boundary is None:
        return "high"
    return "high" if timestep >= boundary else "low"


def timestep_range(expert: str, boundary: float | None, num_train_timesteps: int = 1000) -> tuple[float, float]:
    """The [low, high) timestep range an expert is trained over ('both' or a single transformer: all of it)."""
    if expert not in EXPERT_CHOICES:
        raise ValueError(f"expert must be one of {', '.join(EXPERT_CHOICES)}, got {expert!r}")
    if boundary is None or expert == "both":
        return 0.0, float(num_train_timesteps)
    return (boundary, float(num_train_timesteps)) if expert == "high" else (0.0, boundary)


def timestep_in_range(u: float, expert: str, boundary: float | None, num_train_timesteps: int = 1000) -> float:
    """Maps u in [0, 1) (the objective's draw) into the expert's range, keeping its distribution's shape
    within the range (a linear map, as the peers' min/max timestep options do)."""
    low, high = timestep_range(expert, boundary, num_train_timesteps)
    return low + u * (high - low)
