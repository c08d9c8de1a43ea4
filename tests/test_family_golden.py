"""Golden test of the family port: a fixed-seed LoRA run per Stable Diffusion family writes the
same tensors as it did before the model-family engine existed.

tests/golden/lora_tensors.json was recorded by `python tests/test_family_golden.py --write` on
the code before the port (commit 61727cc); each tensor is summarised by its shape, sum, sum of
absolute values and first values. The tolerances allow for another CPU's float kernels and stay far
below what a real change moves. Measured (2026-11-27, an AMD EPYC Zen 5 against the goldens recorded on
an Intel machine): another CPU moved a tensor's absolute sum by at most 2.1e-5 of itself, its sum by
2.1e-5 of the absolute sum and its first values by 5.2e-4 of their largest; a 1 % higher learning rate
moves them 1.0e-2, 1.7e-3 and 1.1e-2, another seed 0.22, 0.24 and 3.4.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import make_dataset  # noqa: E402
from method_runs import train_run  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden" / "lora_tensors.json"
# sdxl also trains its two text encoders (LoRA on both) and reads size/crop conditioning
RUNS = {"sd1": [], "sd2": ["schedule.batch_size=2"],
        "sdxl": ["network.train_text_encoder=true", "network.text_encoder_lr=5e-4"]}


def summarise(path: Path) -> dict:
    from safetensors.torch import load_file
    out = {}
    for key, t in sorted(load_file(str(path)).items()):
        t = t.double()
        out[key] = [list(t.shape), t.sum().item(), t.abs().sum().item(), t.flatten()[:4].tolist()]
    return out


RECORDED_THREADS = 2   # torch's intra-op threads when the goldens were recorded (sums depend on them)


def golden_run(tmp_path: Path, arch: str, model_dir: Path) -> dict:
    data = make_dataset(tmp_path / "data", n=4, size=32)
    threads = torch.get_num_threads()
    torch.set_num_threads(RECORDED_THREADS)
    try:
        run, _, cfg = train_run(tmp_path, model_dir, data, f"golden-{arch}", "schedule.max_steps=3",
                                "schedule.seed=7", "optimizer.lr=1e-3", *RUNS[arch])
    finally:
        torch.set_num_threads(threads)
    return summarise(run / f"{cfg.output.name}.safetensors")


@pytest.mark.parametrize("arch", list(RUNS))
def test_lora_run_writes_the_same_tensors_as_before_the_port(tmp_path, tiny_models, arch):
    want = json.loads(GOLDEN.read_text())[arch]
    got = golden_run(tmp_path, arch, tiny_models(arch))
    assert sorted(got) == sorted(want), "the LoRA file's keys changed"
    for key, (shape, total, abs_total, head) in want.items():
        g_shape, g_total, g_abs, g_head = got[key]
        assert g_shape == shape, key
        assert g_abs == pytest.approx(abs_total, rel=1e-4, abs=1e-6), key
        # sums of signed values can be near zero: measured against the tensor's absolute sum
        assert abs(g_total - total) <= 2e-4 * abs_total + 1e-6, key
        # one value of an Adam step starting from zero (lora_up) moves with its gradient's rounding
        head_scale = max(abs(v) for v in head)
        assert g_head == pytest.approx(head, rel=0, abs=2e-3 * head_scale + 1e-9), key


if __name__ == "__main__" and "--write" in sys.argv:
    import os
    import tempfile
    from trainer_backend.families.sd.tiny import build_tiny_model
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("SD_STUDIO_CACHE", tmp)
        result = {}
        for arch in RUNS:
            model = build_tiny_model(arch, Path(tmp) / "models" / arch, seed=0)
            result[arch] = golden_run(Path(tmp) / arch, arch, Path(model))
        GOLDEN.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {GOLDEN}")
