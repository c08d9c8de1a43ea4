"""Video latent/token geometry: the frame rule, the tiny Wan VAE's real compression, and the docs' table."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer_backend.families.video_geometry import GEOMETRY, latent_shape, table_markdown, tokens

ROOT = Path(__file__).resolve().parents[1]


@given(st.sampled_from(sorted(GEOMETRY)), st.integers(0, 40), st.integers(1, 40), st.integers(1, 40))
def test_tokens_grow_with_frames_and_size(model, k, w, h):
    g = GEOMETRY[model]
    frames, width, height = k * g.temporal + 1, w * g.spatial * g.patch, h * g.spatial * g.patch
    assert latent_shape(model, frames, width, height) == (g.channels, k + 1, h * g.patch, w * g.patch)
    assert tokens(model, frames, width, height) == (k + 1) * w * h
    assert tokens(model, frames + g.temporal, width, height) > tokens(model, frames, width, height)


def test_a_frame_count_off_the_rule_names_it():
    with pytest.raises(ValueError, match="8k\\+1 frames, not 10"):
        latent_shape("ltx-2", 10, 512, 512)


def test_the_tiny_wan_vae_compresses_as_the_geometry_says():
    torch = pytest.importorskip("torch")
    from trainer_backend.families.wan.tiny import tiny_components
    vae = tiny_components(experts=1)["vae"]
    with torch.no_grad():
        z = vae.encode(torch.zeros(1, 3, 9, 32, 32)).latent_dist.mode()
    assert tuple(z.shape[2:]) == latent_shape("wan2.2-a14b", 9, 32, 32)[1:]


def test_docs_hold_the_current_table():
    assert table_markdown() in (ROOT / "docs" / "video.md").read_text()
