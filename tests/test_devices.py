"""Device-agnostic backend: no hard-coded CUDA outside trainer_backend/compute/devices.py, and the
device helpers work with the device forced to the CPU."""
import re
from pathlib import Path

import pytest
import torch

from trainer_backend.compute import devices

PACKAGE = Path(__file__).resolve().parent.parent / "trainer_backend"
# Backend-specific spellings that must go through devices.py (or come from accelerate).
STRAY = re.compile(r"""\.cuda\(|["']cuda(:\d+)?["']|torch\.cuda\b|torch\.mps\b|["']mps["']|\.to\(["']cuda""")


def stray_device_literals(root: Path) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "compute/devices.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if STRAY.search(code):
                hits.append(f"{path.relative_to(root.parent)}:{number}: {line.strip()}")
    return hits


def test_no_hard_coded_cuda_in_the_backend():
    hits = stray_device_literals(PACKAGE)
    assert not hits, "device-specific code outside trainer_backend/compute/devices.py:\n" + "\n".join(hits)


def test_the_grep_catches_what_it_is_for(tmp_path):
    pkg = tmp_path / "trainer_backend"
    pkg.mkdir()
    (pkg / "compute").mkdir()
    (pkg / "compute" / "devices.py").write_text('x = torch.cuda.memory_allocated()\n')  # allowed here
    (pkg / "ok.py").write_text('y = model.to(accelerator.device)  # not .cuda()\n')
    (pkg / "bad.py").write_text('a = t.cuda()\nb = torch.device("cuda")\nc = torch.cuda.empty_cache()\n')
    hits = stray_device_literals(pkg)
    assert [h.split(":")[1] for h in hits] == ["1", "2", "3"] and all("bad.py" in h for h in hits)


def test_forced_cpu_accelerator_and_helpers(tmp_path):
    from trainer_backend.config import load_config
    from trainer_backend.training.setup import make_accelerator
    cfg = load_config(None, ["hardware.cpu=true", "precision.mixed=no", f"output.dir={tmp_path}"])
    accelerator = make_accelerator(cfg)
    assert accelerator.device.type == "cpu"
    assert devices.device_kind(accelerator.device) == "cpu"
    devices.synchronize(accelerator.device)
    devices.empty_cache(accelerator.device)  # no-ops on the CPU, must not raise
    stats = devices.memory_stats(accelerator.device)
    assert stats.kind == "cpu" and stats.allocated > 0 and stats.total >= stats.allocated
    assert "cpu:" in stats.describe()


def test_training_leaves_cudnn_attention_out_unless_asked(tmp_path):
    """precision.attention = "sdpa" (the default) turns off cuDNN's SDPA kernel before training:
    on an H200 with torch 2.11 it broke Flux.1 LoRA (NaN loss at step 2; docs/performance.md "Measured on a GPU").
    The switch is PyTorch's own, process-wide; "sdpa_cudnn" leaves PyTorch's choice alone."""
    from trainer_backend.config import load_config
    from trainer_backend.training.setup import load_base_model, make_accelerator, place_denoiser
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        for attention, expected in (("sdpa", False), ("sdpa_cudnn", True), ("sdpa", False)):
            cfg = load_config(None, ["hardware.cpu=true", "precision.mixed=no", "model.path=builtin:tiny-sd1",
                                     f"precision.attention={attention}", f"output.dir={tmp_path}"])
            accelerator = make_accelerator(cfg)
            model = load_base_model(cfg, accelerator)
            torch.backends.cuda.enable_cudnn_sdp(not expected)
            place_denoiser(model, cfg, accelerator)
            assert torch.backends.cuda.cudnn_sdp_enabled() is expected, attention
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_a_nan_loss_with_cudnn_attention_allowed_names_that_setting_first(tmp_path):
    from trainer_backend.config import load_config
    from trainer_backend.training.loop import TrainingDiverged, check_finite
    messages = {}
    for attention in ("sdpa", "sdpa_cudnn"):
        cfg = load_config(None, ["hardware.cpu=true", f"precision.attention={attention}", f"output.dir={tmp_path}"])
        check_finite(0.5, cfg, 1)  # a finite loss passes
        with pytest.raises(TrainingDiverged) as caught:
            check_finite(float("nan"), cfg, 2)
        messages[attention] = str(caught.value)
    assert messages["sdpa_cudnn"].startswith("loss became nan at step 2: first try precision.attention = \"sdpa\"")
    assert "precision.attention" not in messages["sdpa"] and "optimizer.lr" in messages["sdpa"]


PEAK_PROBE = """
import json, torch
from trainer_backend.compute import devices
dev = torch.device("cpu")
resettable = devices.reset_peak_memory(dev)
before = devices.peak_memory_bytes(dev)
block = torch.ones(256 * 1024 * 1024 // 4, dtype=torch.float32)  # touched pages: really resident
after = devices.peak_memory_bytes(dev)
del block
reset_to = devices.peak_memory_bytes(dev) if resettable and devices.reset_peak_memory(dev) else None
print(json.dumps([before, after, reset_to]))
"""


def test_cpu_peak_memory_sees_a_large_allocation():
    # a fresh interpreter: a test process that already held (and freed) big buffers may serve the block
    # from memory that is still resident, whatever the order the suite's tests ran in
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", PEAK_PROBE], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    before, after, reset_to = json.loads(out.strip().splitlines()[-1])
    assert after - before >= 256 * 1024 * 1024 // 2, (before, after)
    if reset_to is not None:  # Linux: the high-water mark can be brought back down after a reset
        assert reset_to < after
