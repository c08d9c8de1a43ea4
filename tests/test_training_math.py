"""Training numerics, in process on tiny SD1: the loss goes down and the exported kohya file
reproduces the trained peft UNet (accumulation equivalence is in the family conformance suite)."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_dataset
from trainer_backend.config import load_config
from trainer_backend.training.loop import train
from trainer_backend.config.checks import validate_for_run


def run_training(tmp_path: Path, model_dir: Path, data: Path, name: str, *overrides: str):
    cfg = validate_for_run(load_config(None, [
        f"model.path={model_dir}", f"dataset.path={data}", "dataset.resolution=32",
        f"output.dir={tmp_path / 'runs'}", f"output.name={name}", "precision.mixed=no",
        "network.rank=4", "network.alpha=4", "hardware.cpu=true", "logging.tensorboard=false", *overrides]))
    assert train(cfg) == 0
    run = cfg.run_dir
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return run, events


def test_overfit_loss_drops(tmp_path, tiny_models):
    """A random tiny UNet cannot learn much through attention-only adapters in 60 steps, so
    the adapters also cover the convolutions and projections, and timesteps are the noisy
    700..999 where predicting the noise is learnable fast: a genuine overfit of 2 images."""
    data = make_dataset(tmp_path / "data", n=2, size=32, captions=["a red square", "a red square"])
    targets = "['to_q','to_k','to_v','to_out.0','conv_in','conv_out','proj_in','proj_out']"
    run, events = run_training(tmp_path, tiny_models("sd1"), data, "overfit", "schedule.max_steps=60",
                               "optimizer.lr=1e-2", "schedule.batch_size=2", "optimizer.weight_decay=0",
                               f"network.target_modules={targets}", "loss.timestep_min=700")
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses) == 60
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last <= 0.7 * first, f"loss went from {first:.4f} to {last:.4f}"


def test_export_round_trip_matches_peft_model(tmp_path, tiny_models):
    """The kohya file loaded by diffusers into a fresh pipeline reproduces the trained peft
    UNet (rebuilt from the checkpoint's adapter weights) to 1e-5."""
    from peft import LoraConfig
    from peft.utils import set_peft_model_state_dict
    from trainer_backend.families.sd.loader import build_pipeline, load_model

    model_dir = tiny_models("sd1")
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, _ = run_training(tmp_path, model_dir, data, "rt", "schedule.max_steps=4", "optimizer.lr=1e-2",
                          "checkpoints.every_n_steps=4", "network.train_text_encoder=true")
    peft_model = load_model(str(model_dir))
    peft_model.unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                           target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    set_peft_model_state_dict(peft_model.unet, load_file(
        str(run / "checkpoints" / "step-00000004" / "adapter_unet.safetensors")))

    pipe = build_pipeline(load_model(str(model_dir)))
    pipe.load_lora_weights(str(run / "rt.safetensors"))

    unet_cfg = peft_model.unet.config
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, unet_cfg.in_channels, 8, 8, generator=g)
    t = torch.tensor([10, 500])
    ctx = torch.randn(2, 77, unet_cfg.cross_attention_dim, generator=g)
    with torch.no_grad():
        expected = peft_model.unet(x, t, ctx).sample
        base = load_model(str(model_dir)).unet(x, t, ctx).sample
        got = pipe.unet(x, t, ctx).sample
    assert (expected - base).abs().max() > 1e-4, "training did not change the UNet"
    assert (got - expected).abs().max() <= 1e-5
    # the text-encoder LoRA loaded too
    assert any("lora" in n for n, _ in pipe.text_encoder.named_parameters())


@pytest.mark.parametrize("arch", ["sd1", "sdxl"])
def test_cached_text_encoder_outputs_train_the_same(tmp_path, tiny_models, arch):
    """Caching the frozen text encoders' outputs changes speed, not the result."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    common = ["schedule.max_steps=2", "optimizer.name=sgd", "optimizer.lr=0.5", "network.dropout=0"]
    plain, _ = run_training(tmp_path, tiny_models(arch), data, "plain", *common)
    cached, _ = run_training(tmp_path, tiny_models(arch), data, "cached", *common,
                             "dataset.cache_text_encoder_outputs=true")
    assert "cached text-encoder outputs" in (cached / "train.log").read_text()
    a, b = load_file(str(plain / "plain.safetensors")), load_file(str(cached / "cached.safetensors"))
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7), k
