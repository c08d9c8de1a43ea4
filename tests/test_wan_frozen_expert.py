"""Wan 2.2 A14B trains one expert; the other only samples. A full-size frozen expert waits in host memory in
bf16 (28 GB instead of 57 GB in fp32); a tiny one stays fp32 so the tiny tests stay bit for bit."""
from __future__ import annotations

import os

import torch

from trainer_backend.families.wan import family as wan_family


def test_the_rule_reads_the_experts_weight_files(tmp_path):
    big, small = tmp_path / "transformer_2", tmp_path / "transformer"
    big.mkdir(), small.mkdir()
    with open(big / "diffusion_pytorch_model-00001-of-00006.safetensors", "wb") as f:
        f.truncate(3 * 1024 ** 3)   # sparse: the size a full-size shard reports, no disk used
    (small / "diffusion_pytorch_model.safetensors").write_bytes(os.urandom(1024))
    assert wan_family.frozen_expert_in_bf16(big) and not wan_family.frozen_expert_in_bf16(small)
    assert not wan_family.frozen_expert_in_bf16(tmp_path / "missing")


def test_the_frozen_expert_loads_in_bf16_and_the_trained_one_in_fp32(monkeypatch):
    from trainer_backend.families.builtin import resolve_model_path
    from trainer_backend.families.registry import get_family
    folder = resolve_model_path("builtin:tiny-wan22_t2v")
    monkeypatch.setattr(wan_family, "FROZEN_EXPERT_BF16_BYTES", 0)   # the tiny expert counts as full-size
    model = get_family("wan22_t2v").load(folder, expert="low")
    assert dtypes(model.denoiser) == {torch.float32}
    # the Linear weights in bf16; diffusers keeps its _keep_in_fp32_modules (norms, time embedding) in fp32
    other = model.options["other_expert"]
    assert sum(p.numel() for p in other.parameters() if p.dtype == torch.bfloat16) > \
        sum(p.numel() for p in other.parameters()) / 2
    monkeypatch.undo()
    model = get_family("wan22_t2v").load(folder, expert="low")
    assert dtypes(model.options["other_expert"]) == {torch.float32}


def dtypes(module) -> set:
    return {p.dtype for p in module.parameters()}
