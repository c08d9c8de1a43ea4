"""Latent and token geometry of the video models: how big a clip is to the transformer.

The transformer's cost grows with its token count (attention with its square), so this is the first
number for "does 81 frames at 720p fit": latent frames = (frames - 1) / temporal + 1, tokens = latent
frames x (height / (spatial x patch)) x (width / (spatial x patch))."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VideoGeometry:
    label: str
    temporal: int      # the VAE's temporal compression (the frame-count rule's step)
    spatial: int       # the VAE's spatial compression
    patch: int         # the transformer's spatial patch (1x2x2 for Wan: 2)
    channels: int      # latent channels
    max_frames: int    # the frame count the model was trained at


GEOMETRY = {
    "wan2.2-a14b": VideoGeometry("Wan 2.2 T2V/I2V A14B (Wan 2.1 VAE)", 4, 8, 2, 16, 81),
    "wan2.2-ti2v-5b": VideoGeometry("Wan 2.2 TI2V 5B (Wan 2.2 VAE)", 4, 16, 2, 48, 121),
    "ltx-2": VideoGeometry("LTX-2", 8, 32, 1, 128, 121),
}
SIZES = {"480p": (832, 480), "720p": (1280, 720)}


def latent_shape(model: str, frames: int, width: int, height: int) -> tuple[int, int, int, int]:
    """(channels, latent frames, latent height, latent width) of a clip; frames must follow the rule."""
    g = GEOMETRY[model]
    if frames < 1 or (frames - 1) % g.temporal:
        raise ValueError(f"{g.label} takes {g.temporal}k+1 frames, not {frames}")
    return g.channels, (frames - 1) // g.temporal + 1, height // g.spatial, width // g.spatial


def tokens(model: str, frames: int, width: int, height: int) -> int:
    g = GEOMETRY[model]
    _, f, h, w = latent_shape(model, frames, width, height)
    return f * (h // g.patch) * (w // g.patch)


def table_markdown(frame_counts: dict[str, tuple[int, ...]] | None = None) -> str:
    """The docs' table: tokens per clip for each model at 480p/720p and a few frame counts."""
    counts = frame_counts or {"wan2.2-a14b": (1, 33, 81), "wan2.2-ti2v-5b": (1, 49, 121), "ltx-2": (1, 49, 121)}
    rows = ["| model | frames | 480p (832x480) tokens | 720p (1280x720) tokens |", "|---|---:|---:|---:|"]
    for model, frames in counts.items():
        for n in frames:
            cells = [f"{tokens(model, n, *SIZES[s]):,}" for s in ("480p", "720p")]
            rows.append(f"| {GEOMETRY[model].label} | {n} | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)
