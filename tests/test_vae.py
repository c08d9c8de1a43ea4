"""VAE fine-tuning on tiny SD1: the reconstruction loss on the training images goes down, the
saved diffusers folder and single file load (through model.vae too) with the trained weights,
a later LoRA run uses the trained VAE, and fp16 is refused with the reason."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from PIL import Image

from conftest import make_dataset
from trainer_backend.config import ConfigError, load_config
from trainer_backend.config.checks import validate_for_run


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def run_cfg(tmp_path, model_dir, data, name, *overrides):
    return validate_for_run(load_config(None, [
        f"model.path={model_dir}", f"dataset.path={data}", "dataset.resolution=32", f"output.dir={tmp_path / 'runs'}",
        f"output.name={name}", "hardware.cpu=true", "logging.tensorboard=false", "checkpoints.at_end=false",
        *overrides]))


@torch.no_grad()
def reconstruction_l1(vae, pixels: torch.Tensor) -> float:
    """What a user would measure: encode (posterior mean), decode, mean absolute error."""
    vae = vae.float().eval()
    return (vae.decode(vae.encode(pixels).latent_dist.mean).sample - pixels).abs().mean().item()


def images(data) -> torch.Tensor:
    from trainer_backend.data.dataset import to_tensor
    return torch.stack([to_tensor(Image.open(p).convert("RGB")) for p in sorted(data.glob("*.png"))])


def sample_paths(run_dir) -> list[str]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return next(e["paths"] for e in events if e["event"] == "sample")


def first_loss(run_dir) -> float:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return next(e["loss"] for e in events if e["event"] == "step")


def test_fp16_is_refused_with_the_reason(tmp_path):
    from trainer_backend.training.loop import train
    cfg = load_config(None, ["network.type=vae", "vae.precision=fp16", f"output.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^vae.precision: fp16 is refused.*overflow.*NaN"):
        train(cfg)


def test_vae_fine_tune_outputs_and_later_lora_run(tmp_path, tiny_models):
    from diffusers import AutoencoderKL
    from trainer_backend.training.loop import train
    from trainer_backend.families.sd.loader import load_model
    model_dir = tiny_models("sd1")
    data = make_dataset(tmp_path / "data", n=4, size=32)
    pixels = images(data)
    base_vae = AutoencoderKL.from_pretrained(str(model_dir), subfolder="vae")

    cfg = run_cfg(tmp_path, model_dir, data, "vae", "network.type=vae", "schedule.max_steps=24",
                  "schedule.batch_size=2", "optimizer.lr=2e-3", "optimizer.weight_decay=0",
                  f"validation.path={data}", "validation.every_n_steps=12")
    assert cfg.vae.decoder_only and cfg.vae.precision == "fp32"  # the defaults under test
    assert train(cfg) == 0
    folder, single = cfg.run_dir / "vae-vae", cfg.run_dir / "vae-vae.safetensors"
    trained = AutoencoderKL.from_pretrained(str(folder))
    before, after = reconstruction_l1(base_vae, pixels), reconstruction_l1(trained, pixels)
    assert after < 0.8 * before, (before, after)
    # validation: the same reconstruction measure, tracked during the run (vae.loss is l1)
    events = [json.loads(line) for line in (cfg.run_dir / "events.jsonl").read_text().splitlines()]
    vals = [e for e in events if e["event"] == "validation"]
    assert [e["step"] for e in vals] == [12, 24] and all(e["loss"] < 0.8 * before for e in vals)
    assert vals[1]["loss"] == pytest.approx(after, rel=1e-4)
    # decoder only: the encoder (the latent space LoRAs were trained on) is untouched
    for (name, a), b in zip(base_vae.encoder.state_dict().items(), trained.encoder.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(base_vae.decoder.conv_out.weight, trained.decoder.conv_out.weight)

    # the single file is in the original layout and loads as model.vae with the same weights
    keys = load_file(str(single)).keys()
    assert "decoder.conv_out.weight" in keys and "encoder.down.0.block.0.conv1.weight" in keys
    for vae_spec in (folder, single):
        loaded = load_model(str(model_dir), vae=str(vae_spec)).vae
        for (name, a), b in zip(trained.state_dict().items(), loaded.state_dict().values()):
            assert torch.allclose(a, b), (vae_spec.name, name)

    # A later LoRA run with model.vae = the single file. The encoder is unchanged, so training is
    # the same (same latents, same loss); the fine-tuned decoder shows in the run's sample images.
    lora = ["network.type=lora", "network.rank=4", "precision.mixed=no", "schedule.max_steps=1",
            "samples.prompts='a red square'", "samples.before_first_step=true", "samples.steps=2"]
    base_run = run_cfg(tmp_path, model_dir, data, "lora-base", *lora)
    vae_run = run_cfg(tmp_path, model_dir, data, "lora-vae", *lora, f"model.vae={single}")
    assert train(base_run) == 0 and train(vae_run) == 0
    assert (vae_run.run_dir / "lora-vae.safetensors").is_file()
    assert first_loss(vae_run.run_dir) == first_loss(base_run.run_dir)
    base_image, vae_image = (np.asarray(Image.open(sample_paths(r.run_dir)[0])).astype(int)
                             for r in (base_run, vae_run))
    assert np.abs(base_image - vae_image).mean() > 1.0  # decoded by another decoder


def test_encoder_and_decoder_with_kl(tmp_path, tiny_models):
    from diffusers import AutoencoderKL
    from trainer_backend.training.loop import train
    model_dir = tiny_models("sd1")
    data = make_dataset(tmp_path / "data", n=2, size=32)
    cfg = run_cfg(tmp_path, model_dir, data, "vae-kl", "network.type=vae", "vae.decoder_only=false",
                  "vae.loss=mse", "vae.kl_weight=1e-4", "schedule.max_steps=3", "optimizer.lr=1e-3",
                  "vae.save_precision=fp16")
    assert train(cfg) == 0
    base = AutoencoderKL.from_pretrained(str(model_dir), subfolder="vae")
    trained = AutoencoderKL.from_pretrained(str(cfg.run_dir / "vae-kl-vae"))
    saved = load_file(str(cfg.run_dir / "vae-kl-vae" / "diffusion_pytorch_model.safetensors"))
    assert {v.dtype for v in saved.values()} == {torch.float16}  # vae.save_precision
    assert {v.dtype for v in load_file(str(cfg.run_dir / "vae-kl-vae.safetensors")).values()} == {torch.float16}
    assert not torch.equal(base.encoder.conv_in.weight.half(), trained.encoder.conv_in.weight)
    events = [json.loads(line) for line in (cfg.run_dir / "events.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses) == 3 and all(isinstance(v, float) for v in losses)


def test_stop_request_saves_state_and_exits_75(tmp_path, tiny_models):
    """The Stop button (control/stop, then SIGTERM) ends a VAE run like a LoRA run: a checkpoint,
    a `stopped` event, the resume hint in the log, exit code 75 (the shared stop path)."""
    import signal
    import subprocess
    import sys
    import time
    from conftest import ROOT
    from trainer_backend.config import dumps_toml, to_dict
    data = make_dataset(tmp_path / "data", n=2, size=32)
    cfg = run_cfg(tmp_path, tiny_models("sd1"), data, "vstop", "network.type=vae", "precision.mixed=no",
                  "schedule.max_steps=100000")
    config = tmp_path / "vstop.toml"
    config.write_text(dumps_toml(to_dict(cfg)), encoding="utf-8")
    child = subprocess.Popen([sys.executable, "-m", "trainer_backend", "train", "--config", str(config)], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    events_file = cfg.run_dir / "events.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and child.poll() is None:
        if events_file.exists() and '"event": "step"' in events_file.read_text():
            break
        time.sleep(0.2)
    (cfg.run_dir / "control" / "stop").write_text("")   # what the GUI's Stop does: mark it as the user's,
    child.send_signal(signal.SIGTERM)                    # then ask the trainer to stop
    _, err = child.communicate(timeout=300)
    assert child.returncode == 75, err[-3000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    stopped = [e for e in events if e["event"] == "stopped"]
    assert len(stopped) == 1 and not any(e["event"] == "done" for e in events)
    assert any(e["event"] == "checkpoint" and e["step"] == stopped[0]["step"] for e in events)
    assert "Resume by starting the same config again" in (cfg.run_dir / "train.log").read_text()
