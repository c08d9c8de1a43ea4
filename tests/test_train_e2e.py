"""End to end through a real `accelerate launch` subprocess, for each tiny architecture:
the LoRA file exists, has kohya keys and metadata, loads with diffusers' load_lora_weights,
and changes the generated image."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from conftest import ROOT, make_dataset


@pytest.mark.parametrize("arch", ["sd1", "sd2", "sdxl"])
def test_lora_end_to_end_through_accelerate(arch, tmp_path, tiny_models):
    model_dir = tiny_models(arch)
    data = make_dataset(tmp_path / "data", n=3, size=64)
    cmd = [sys.executable, "-m", "trainer_backend", "launch",
           "--set", f"model.path={model_dir}", "--set", f"dataset.path={data}",
           "--set", "dataset.resolution=64", "--set", f"output.dir={tmp_path / 'runs'}",
           "--set", f"output.name={arch}-lora", "--set", "schedule.max_steps=3", "--set", "network.rank=4",
           "--set", "network.alpha=4", "--set", "precision.mixed=no", "--set", "optimizer.lr=1e-2",
           "--set", "hardware.cpu=true", "--set", f"network.train_text_encoder={'true' if arch == 'sd1' else 'false'}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "runs" / f"{arch}-lora"
    out = run / f"{arch}-lora.safetensors"
    assert out.is_file()

    with safe_open(str(out), "pt") as f:
        keys = list(f.keys())
        meta = f.metadata()
    assert keys and all(k.startswith(("lora_unet_", "lora_te")) for k in keys)
    assert any(k.endswith(".lora_down.weight") for k in keys) and any(k.endswith(".alpha") for k in keys)
    if arch == "sd1":
        assert any(k.startswith("lora_te_text_model_encoder_layers_") for k in keys)
    if arch == "sdxl":  # kohya's SDXL LoRAs name UNet modules in the original (sgm) layout
        assert any(k.startswith("lora_unet_input_blocks_") for k in keys)
        assert not any(k.startswith("lora_unet_down_blocks_") for k in keys)
    assert meta["ss_network_dim"] == "4" and meta["ss_steps"] == "3"
    freq = json.loads(meta["ss_tag_frequency"])  # per subset folder: tag -> count, as kohya writes it
    assert sum(freq["data"].values()) == 3 and "a red square on a plain background" in freq["data"]
    assert meta["ss_base_model_version"] == {"sd1": "sd_v1", "sd2": "sd_v2", "sdxl": "sdxl_base_v1-0"}[arch]

    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "plan" and kinds[-1] == "done" and kinds.count("step") == 3
    assert all("time" in e for e in events)
    assert (run / "config.toml").is_file() and (run / "command.txt").is_file() and (run / "train.log").is_file()
    assert any((run / "tb").iterdir())

    from trainer_backend.families.sd.loader import build_pipeline, load_model
    pipe = build_pipeline(load_model(str(model_dir)))
    pipe.set_progress_bar_config(disable=True)

    def image():
        g = torch.Generator().manual_seed(0)
        return torch.from_numpy(pipe("a red square", num_inference_steps=2, height=64, width=64, generator=g,
                                     output_type="np").images[0])
    before = image()
    pipe.load_lora_weights(str(out))
    after = image()
    assert (after - before).abs().max() > 1e-3, "the LoRA did not change the output"
