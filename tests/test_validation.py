"""Validation loss: identical for two evaluations of the same weights (fixed timesteps and
noise), different when the weights change, dropping while a tiny model overfits its images,
streamed as `validation` events; off by default and then nothing is loaded."""
import json
import shutil

import pytest
import torch

from conftest import make_dataset
from trainer_backend.run.checkpoint_files import TrainState
from trainer_backend.config import ConfigError, load_config
from trainer_backend.data.scan import held_out_positions
from trainer_backend.config.checks import validate_for_run
from trainer_backend.diffusion.validation import Validator, fixed_timesteps, validation_scan


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def base_overrides(tmp_path, model_dir, data, name):
    return [f"model.path={model_dir}", f"dataset.path={data}", "dataset.resolution=32",
            f"output.dir={tmp_path / 'runs'}", f"output.name={name}", "precision.mixed=no", "network.rank=4",
            "hardware.cpu=true", "logging.tensorboard=false", "checkpoints.at_end=false"]


def test_fixed_timesteps_and_held_out_positions():
    assert fixed_timesteps(0, 1000, 4) == [125, 375, 625, 875]
    assert fixed_timesteps(700, 1000, 3) == [750, 850, 950]
    assert fixed_timesteps(10, 12, 5) == [10, 11]  # never more than the range holds
    assert held_out_positions(10, 0, 0.2) == {2, 7}
    assert held_out_positions(10, 5) == {4, 9}
    assert held_out_positions(3, 0, 0.1) == {1}  # at least one image
    assert held_out_positions(1, 0, 0.5) == set()  # never the only one


def test_off_by_default_loads_nothing():
    cfg = load_config(None, [])
    validator = Validator(cfg)  # no model, no accelerator: nothing is touched when off
    assert not validator.active
    assert validator.maybe_run(TrainState(global_step=10), epoch_end=True) is None
    assert validator.metrics() == {}


def test_missing_validation_images_name_the_keys(tmp_path):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    cfg = load_config(None, [f"dataset.path={data}", "validation.every_n_steps=5"])
    with pytest.raises(ConfigError, match="validation.path, validation.fraction or dataset.validation_every_nth"):
        validation_scan(cfg)
    cfg = load_config(None, [f"dataset.path={data}", "validation.every_n_steps=5",
                             f"validation.path={tmp_path / 'nope'}"])
    with pytest.raises(ConfigError, match="validation.path: .* is not a folder"):
        validation_scan(cfg)


def test_same_weights_same_loss_and_the_split(tmp_path, tiny_models):
    """A held-out fraction: the training scan and the validation scan share no image; two
    evaluations of the same weights agree exactly; changing a weight changes the loss."""
    from trainer_backend.data import scan_dataset
    from trainer_backend.training.setup import load_base_model, make_accelerator, open_run, place_model
    data = make_dataset(tmp_path / "data", n=4, size=32)
    cfg = validate_for_run(load_config(None, base_overrides(tmp_path, tiny_models("sdxl"), data, "val") + [
        "validation.every_n_steps=1", "validation.fraction=0.5", "validation.batch_size=1",
        "dataset.flip=true", "dataset.caption_dropout=0.5", "loss.noise_offset=0.05"]))
    train_paths = {item.path for item in scan_dataset(cfg).items}
    val_paths = {item.path for item in validation_scan(cfg).items}
    assert len(train_paths) == len(val_paths) == 2 and not train_paths & val_paths

    accelerator = make_accelerator(cfg)
    run = open_run(cfg, accelerator)
    model = load_base_model(cfg, accelerator)
    weight_dtype = place_model(model, cfg, accelerator)
    validator = Validator(cfg, model, accelerator, run, weight_dtype, model.unet, model.text_encoders)
    first, second = validator.evaluate(), validator.evaluate()
    assert first == second and first > 0
    with torch.no_grad():
        model.unet.conv_out.bias += 0.05
    assert validator.evaluate() != first
    run.events.close()


def test_validation_loss_drops_while_overfitting(tmp_path, tiny_models):
    """Training and validation on the same two images (validation.path is a copy of the
    dataset): the validation loss at the last evaluation is below the first."""
    data = make_dataset(tmp_path / "data", n=2, size=32, captions=["a red square", "a red square"])
    shutil.copytree(data, tmp_path / "val")
    targets = "['to_q','to_k','to_v','to_out.0','conv_in','conv_out','proj_in','proj_out']"
    cfg = validate_for_run(load_config(None, base_overrides(tmp_path, tiny_models("sd1"), data, "overfit") + [
        "schedule.max_steps=24", "optimizer.lr=1e-2", "schedule.batch_size=2", "optimizer.weight_decay=0",
        f"network.target_modules={targets}", "loss.timestep_min=700", f"validation.path={tmp_path / 'val'}",
        "validation.every_n_steps=8", "validation.every_n_epochs=1000", "validation.timesteps=3",
        "checkpoints.every_n_steps=8", "checkpoints.keep_last=1", "checkpoints.keep_best=1",
        "checkpoints.best_metric=validation_loss"]))
    from trainer_backend.training.loop import train
    assert train(cfg) == 0
    events = [json.loads(line) for line in (cfg.run_dir / "events.jsonl").read_text().splitlines()]
    vals = [e for e in events if e["event"] == "validation"]
    assert [e["step"] for e in vals] == [8, 16, 24]
    assert all(e["timesteps"] == [750, 850, 950] and e["images"] == 2 for e in vals)
    losses = [e["loss"] for e in vals]
    assert losses[-1] < 0.9 * losses[0], losses
    assert vals[-1]["best"] == min(losses)
    # keep-best retention sees the validation loss of the step each checkpoint was saved at
    from trainer_backend.run.checkpoint_files import checkpoint_infos
    by_step = {e["step"]: e["loss"] for e in vals}
    kept = checkpoint_infos(cfg.run_dir)
    assert kept and all(metrics["validation_loss"] == by_step[step] for step, metrics in kept)
    assert min(losses) in [metrics["validation_loss"] for _, metrics in kept]


@pytest.mark.both_cores
def test_two_ranks_give_the_one_process_value(tmp_path, tiny_models):
    """Two gloo ranks share 3 validation images (one rank runs a zero-weighted padding batch);
    the all-reduced loss equals a one-process evaluation of the run's exported LoRA."""
    import subprocess
    import sys
    from pathlib import Path
    from trainer_backend.families.sd.loader import build_pipeline
    from trainer_backend.training.setup import load_base_model, make_accelerator, open_run, place_model
    root = Path(__file__).resolve().parent.parent
    data = make_dataset(tmp_path / "data", n=4, size=32)
    make_dataset(tmp_path / "val", n=3, size=32, seed=7)
    common = base_overrides(tmp_path, tiny_models("sd1"), data, "two") + [
        "schedule.max_steps=2", "optimizer.lr=1e-2", f"validation.path={tmp_path / 'val'}",
        "validation.every_n_steps=1", "validation.batch_size=1", "hardware.num_processes=2"]  # 1 step on 2 ranks
    cmd = [sys.executable, "-m", "trainer_backend", "launch"]
    for item in common:
        cmd += ["--set", item]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    run_dir = tmp_path / "runs" / "two"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    [val] = [e for e in events if e["event"] == "validation"]
    assert val["step"] == 1 and val["images"] == 3

    cfg = validate_for_run(load_config(run_dir / "config.toml", ["hardware.num_processes=1", "output.name=one"]))
    accelerator = make_accelerator(cfg)
    run = open_run(cfg, accelerator)
    model = load_base_model(cfg, accelerator)
    weight_dtype = place_model(model, cfg, accelerator)
    build_pipeline(model).load_lora_weights(str(run_dir / "two.safetensors"))
    one = Validator(cfg, model, accelerator, run, weight_dtype, model.unet, model.text_encoders).evaluate()
    run.events.close()
    assert one == pytest.approx(val["loss"], rel=1e-5)
