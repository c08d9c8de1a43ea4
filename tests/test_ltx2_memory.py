"""LTX-2's memory table is measured on the real full-size model: the video VAE with LTX-2's own compression
(32x spatial, 8x temporal), Gemma 3 12B, the full-size text connectors counted with the text encoder, the
48-block transformer; the bundled table is what that build gives, and the planner plans LTX-2 clips by
their 8k+1 frames."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from trainer_backend.config import from_dict
from trainer_backend.launch.memory_plan import clip_frames, plan_memory
from trainer_backend.launch.memory_tables import family_table, weight_bytes
from trainer_backend.training import memory_probe as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_memory_tables as tables  # noqa: E402


@pytest.fixture(scope="module")
def full_size(tiny_models):
    return mp.full_size_model("ltx2", tiny_models("ltx2"), tables.build_components("ltx2"))


def params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_the_full_size_pieces_have_the_published_sizes_and_compression(full_size):
    # Gemma 3 12B: 12.2 B with its vision tower; the text model alone is Keras' published gemma3_12b_text
    # count (11,765,788,416, a 262,144-token vocabulary) plus the 64 extra rows of transformers' 262,208
    encoder = full_size.text_encoders[0]
    assert params(encoder) == 12_187_325_040
    assert params(encoder.model.language_model) == 11_765_788_416 + 64 * 3840
    assert 18.8e9 < params(full_size.denoiser) < 19.0e9            # "a 19B audio-video transformer"
    assert len(full_size.denoiser.transformer_blocks) == 48
    assert 1.42e9 < params(full_size.options["connectors"]) < 1.44e9  # the full-size connectors, not the tiny ones
    vae = full_size.vae
    assert (vae.spatial_compression_ratio, vae.temporal_compression_ratio) == (32, 8)
    assert full_size.vae_scale_factor == 32
    with torch.device("meta"):   # 9 frames of 64 px -> 2 latent frames of 2x2
        latents = vae.encode(torch.zeros(1, 3, 9, 64, 64)).latent_dist.mean
    assert tuple(latents.shape) == (1, 128, 2, 2, 2)
    assert full_size.family.latent_shape(full_size, 512, 768, frames=121) == (128, 16, 16, 24)


def test_the_bundled_table_is_the_full_size_build_with_the_connectors_in_the_text_encoder(full_size):
    table = family_table("ltx2")
    assert table is not None, "assets/memory_tables.json lacks ltx2 (tools/make_memory_tables.py --families ltx2)"
    fresh = mp.static_table(full_size, tables.companions("ltx2"))
    assert table["vae_scale_factor"] == 32
    for name, entry in fresh["components"].items():
        assert table["components"][name] == entry, name
    text = table["components"]["text_encoder"]
    connectors = params(full_size.options["connectors"])
    assert text["with"] == {"connectors": connectors}
    assert text["params"] == params(full_size.text_encoders[0]) + connectors
    # quantize_text_encoders quantizes Gemma, not the connectors: they stay in bf16 beside it
    assert weight_bytes(text, "bf16", "nf4") > connectors * 2 + params(full_size.text_encoders[0]) * 0.5


def test_clips_are_planned_by_ltx2s_frame_rule_and_long_clips_need_more():
    def cfg(frames, res=640):
        return from_dict({"model": {"arch": "ltx2"},
                          "dataset": {"resolution": res, "video_frames": frames, "cache_latents": True,
                                      "cache_text_encoder_outputs": True, "text_cache_batch_size": 1},
                          "precision": {"gradient_checkpointing": True}, "memory": {"offload_encoders": True}})
    assert clip_frames(cfg(121), "ltx2") == (121, 16)
    assert clip_frames(cfg(124), "ltx2") == (121, 16)     # rounded down to 8k+1
    short, long = plan_memory(cfg(49)), plan_memory(cfg(121))
    assert long.latent_frames == 16 and any("121 frames (16 latent frames)" in n for n in long.notes)
    assert long.phases["forward/backward"] > short.phases["forward/backward"]
    # the VAE encodes a clip's frames at once (no chunks as Wan's): the cache pass grows with the frames
    assert long.cache_phases["latent cache"]["latent cache batch"] > short.cache_phases["latent cache"]["latent cache batch"]
    assert long.counts["text_encoders"] == family_table("ltx2")["components"]["text_encoder"]["params"]


def test_a_builtin_tiny_ltx2_is_sized_with_its_connectors(tiny_models):
    from trainer_backend.launch.model_size import builtin_entry, folder_components
    folder = tiny_models("ltx2")
    entry = builtin_entry("tiny-ltx2")
    read = folder_components(folder, family_table("ltx2")["components"])
    assert entry["components"] == read
    alone = folder_components(folder, ["text_encoder"])["text_encoder"]["params"]
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    connectors = params(LTX2TextConnectors.from_pretrained(str(folder / "connectors")))
    assert read["text_encoder"]["params"] == alone + connectors


def test_the_checkpointed_line_holds_for_a_long_clip(tiny_models):
    """The table's line is fitted on one-frame probes; a probe of a real clip (640 px x 57 frames: 8 latent
    frames, 3,200 video tokens) on the meta device lands on it (the line from 512-1024 px probes read 13% low here)."""
    from trainer_backend.config import from_dict as config_of
    from trainer_backend.diffusion.loss import diffusion_loss
    from trainer_backend.methods import setup_method
    from trainer_backend.training.meta_values import AllValid
    from trainer_backend.training.setup import place_model
    meta = torch.device("meta")
    full_size = mp.full_size_model("ltx2", tiny_models("ltx2"), tables.build_components("ltx2"))  # adapters go on it
    cfg = config_of({"model": {"arch": "ltx2"}, "network": {"type": "lora", "rank": 16}, "precision": {"mixed": "bf16"}})
    with AllValid():
        for module in full_size.components().values():
            module.to(meta)
        dtype = place_model(full_size, cfg, mp._Device(meta))
        setup_method(full_size, cfg)
        full_size.denoiser.enable_gradient_checkpointing()
        sample = mp._sample(full_size, (640, 640), 1, meta)
        sample["latents"] = torch.zeros(1, 128, 8, 20, 20, device=meta)
        with mp.MetaAutocast(dtype), mp.LiveBytes() as tally:
            diffusion_loss(full_size, full_size.denoiser, sample, cfg=cfg, epoch=0, device=meta,
                           weight_dtype=dtype).backward()
            grads = sum(p.grad.numel() * p.grad.element_size() for p in full_size.denoiser.parameters()
                        if p.grad is not None)
    a, b = family_table("ltx2")["activations"]["lora_gc"]
    assert tally.peak - grads == pytest.approx(a + b * 8 * 20 * 20, rel=0.05)


def test_a_clips_vae_encode_is_planned_as_the_vae_runs_it(full_size):
    """LTX-2's VAE encodes a clip's frames at once and shrinks time as it goes: each frame after the first adds
    the table's vae_frame_share of one frame's encode. A probe of a 33-frame clip's encode on the meta device
    lands on the plan (one frame's line times 33 would be twice it)."""
    from trainer_backend.launch.memory_plan import VAE_ENCODE_CUDA
    for module in full_size.components().values():
        module.to("meta")
    probed = mp.probe_vae_encode(full_size, (640, 640), 1, "meta", frames=33)
    cfg = from_dict({"model": {"arch": "ltx2"}, "dataset": {"resolution": 640, "video_frames": 33,
                                                            "cache_latents": True, "latent_cache_batch_size": 1}})
    planned = plan_memory(cfg).cache_phases["latent cache"]["latent cache batch"] / VAE_ENCODE_CUDA
    assert planned == pytest.approx(probed, rel=0.05)
    a, b = family_table("ltx2")["vae_encode"]
    assert (a + b * 20 * 20) * 33 > 1.8 * probed
