"""precision.full_bf16: weights kept in bf16 with no fp32 master copy. Stochastic rounding is
unbiased where nearest rounding loses small updates; a full fine-tune of tiny SDXL trains with
bf16 weights (also after a resume) and a finite loss; the plan warns; bad combinations name the key."""
import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_dataset
from trainer_backend.config import ConfigError, load_config
from trainer_backend.training.full_half_precision import check_half_weights, half_weights_warnings
from trainer_backend.training.half_precision_optimizers import HalfWeightsAdamW, HalfWeightsSGD, stochastic_round
from trainer_backend.config.checks import validate_for_run


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.mark.parametrize("dtype, value", [(torch.bfloat16, 1 + 1 / 1024), (torch.float16, 1 + 1 / 4096),
                                          (torch.bfloat16, -3.01), (torch.float16, 1e-3 + 1e-7)])
def test_stochastic_rounding_is_unbiased(dtype, value):
    x = torch.full((200_000,), value, dtype=torch.float32)
    rounded = stochastic_round(x, dtype, torch.Generator().manual_seed(0))
    assert rounded.dtype == dtype
    nearest = x.to(dtype).float()[0].item()
    assert len(set(rounded.float().tolist())) == 2  # only the two neighbours
    assert abs(rounded.float().mean().item() - value) < abs(nearest - value) / 10


@pytest.mark.parametrize("rounding", ["stochastic", "kahan", "nearest"])
def test_small_updates_survive_in_bf16(rounding):
    """100 SGD steps of 1e-4 on a weight of 1.0 (bf16 spacing there is 1/256 to 1/128): fp32 reaches
    0.99, nearest rounding never moves, stochastic rounding is right on average, Kahan summation
    keeps every weight within half a spacing (it carries the rest in its compensation buffer)."""
    w = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
    opt = HalfWeightsSGD([w], lr=1e-4, rounding=rounding, seed=1)
    for _ in range(100):
        w.grad = torch.ones_like(w)
        opt.step()
    assert w.dtype == torch.bfloat16
    mean = w.float().mean().item()
    if rounding == "nearest":
        assert mean == 1.0
    elif rounding == "stochastic":
        assert abs(mean - 0.99) < 1e-3, mean
    else:
        assert (w.float() - 0.99).abs().max().item() <= 0.5 / 256, w.float().unique()


def test_adamw_half_weights_state_and_resume():
    """bf16 moments for fp16 weights survive a state_dict round trip (torch would cast them to fp16)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, dtype=torch.float16))
    opt = HalfWeightsAdamW([w], lr=1e-3, weight_decay=0.0)
    w.grad = (torch.randn(64) * 1e-4).half()
    opt.step()
    saved = opt.state_dict()
    again = HalfWeightsAdamW([w], lr=1e-3, weight_decay=0.0)
    again.load_state_dict(saved)
    state = again.state[w]
    assert state["exp_avg_sq"].dtype == torch.bfloat16 and state["exp_avg_sq"].abs().min() > 0
    assert w.dtype == torch.float16


def test_config_rules_and_plan_warning(tmp_path):
    with pytest.raises(ConfigError, match=r'^precision.full_bf16: needs precision.mixed = "bf16"'):
        check_half_weights(load_config(None, ["precision.full_bf16=true", "precision.mixed=no"]))
    with pytest.raises(ConfigError, match="^precision.full_fp16: choose one"):
        check_half_weights(load_config(None, ["precision.full_bf16=true", "precision.full_fp16=true"]))
    assert half_weights_warnings(load_config(None, [])) == []
    cfg = load_config(None, ["precision.full_bf16=true", "network.type=full"])
    check_half_weights(cfg)
    [note] = half_weights_warnings(cfg)
    assert "no fp32 master copy" in note and "stochastic rounding" in note
    [note] = half_weights_warnings(load_config(None, ["precision.full_bf16=true", "optimizer.name=adafactor"]))
    assert "rounds updates to nearest" in note


def test_full_fine_tune_tiny_sdxl_keeps_bf16_weights(tmp_path, tiny_models):
    from trainer_backend.training.loop import train
    data = make_dataset(tmp_path / "data", n=2, size=32)

    def run(steps: int):
        cfg = validate_for_run(load_config(None, [
            f"model.path={tiny_models('sdxl')}", f"dataset.path={data}", "dataset.resolution=32",
            f"output.dir={tmp_path / 'runs'}", "output.name=fb", "hardware.cpu=true", "logging.tensorboard=false",
            "network.type=full", "precision.mixed=bf16", "precision.full_bf16=true", "optimizer.lr=1e-3",
            f"schedule.max_steps={steps}", "network.save_precision=fp32"]))
        assert train(cfg) == 0
        return cfg.run_dir

    run_dir = run(2)
    first = load_file(str(run_dir / "checkpoints" / "step-00000002" / "full_unet.safetensors"))
    assert {v.dtype for v in first.values() if v.is_floating_point()} == {torch.bfloat16}
    run_dir = run(3)  # resumes from step 2: the loaded weights stay bf16 and keep training
    second = load_file(str(run_dir / "checkpoints" / "step-00000003" / "full_unet.safetensors"))
    assert {v.dtype for v in second.values() if v.is_floating_point()} == {torch.bfloat16}
    assert any(not torch.equal(first[k], second[k]) for k in first)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses) == 3 and all(isinstance(v, float) and v == v and abs(v) < 1e3 for v in losses)
    assert any(e["event"] == "resumed" for e in events)
    plan = next(e for e in events if e["event"] == "plan")
    assert any("precision.full_bf16" in w for w in plan["warnings"])


def test_full_bf16_with_ema_keeps_an_fp32_average_and_saves_it(tmp_path, tiny_models):
    """bf16 weights, fp32 EMA: with decay 0.5 the average moves by half of each update, far more
    than bf16 could hold for a slow decay; the output holds the EMA rounded once, not the raw weights."""
    from trainer_backend.training.loop import train
    data = make_dataset(tmp_path / "data", n=2, size=32)
    cfg = validate_for_run(load_config(None, [
        f"model.path={tiny_models('sd1')}", f"dataset.path={data}", "dataset.resolution=32",
        f"output.dir={tmp_path / 'runs'}", "output.name=fbema", "hardware.cpu=true", "logging.tensorboard=false",
        "network.type=full", "precision.mixed=bf16", "precision.full_bf16=true", "optimizer.lr=1e-3",
        "schedule.max_steps=3", "network.save_precision=fp32", "ema.enabled=true", "ema.decay=0.5"]))
    assert train(cfg) == 0
    step = cfg.run_dir / "checkpoints" / "step-00000003"
    raw = load_file(str(step / "full_unet.safetensors"))
    ema = load_file(str(step / "ema.safetensors"))
    assert {v.dtype for v in ema.values()} == {torch.float32}
    assert {v.dtype for v in raw.values() if v.is_floating_point()} == {torch.bfloat16}
    out = load_file(str(cfg.run_dir / "fbema-diffusers" / "unet" / "diffusion_pytorch_model.safetensors"))
    shared = [k for k in out if f"unet.{k}" in ema]
    assert shared, "the EMA names the UNet's weights"
    for k in shared:  # the output is the EMA, rounded to the bf16 the weights live in
        assert torch.equal(out[k], ema[f"unet.{k}"].to(torch.bfloat16).float()), k
    assert any(not torch.equal(out[k].to(torch.bfloat16), raw[k]) for k in shared)
