"""optimizer.fused_backward (training/fused_backward.py): stepping each weight inside the backward pass gives
the weights the ordinary step gives (batch 1, accumulation 1), with the LR schedule and EMA unchanged; a
checkpoint taken with it resumes exactly; the combinations it cannot do exactly are refused naming the keys."""
from __future__ import annotations

import copy
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import make_dataset
from tests.method_runs import train_run
from tests.test_block_swap import Chain, assert_same
from trainer_backend.config import load_config, rules
from trainer_backend.training.fused_backward import FusedBackward
from trainer_backend.training.optimizers import build_optimizer


def problems(*overrides: str) -> list[str]:
    cfg = load_config(None, ["optimizer.fused_backward=true", "optimizer.max_grad_norm=0", *overrides])
    return [str(p) for p in rules.problems(cfg)]


def test_fused_backward_refusals_name_the_keys():
    assert problems() == []
    assert problems("network.type=full") == []
    (accum,) = problems("schedule.grad_accum=4")
    assert accum.startswith("optimizer.fused_backward:") and "schedule.grad_accum = 1 (got 4)" in accum
    (clip,) = problems("optimizer.max_grad_norm=1.0")
    assert "optimizer.max_grad_norm = 0 (got 1.0)" in clip
    assert "optimizer.max_grad_norm = 0" in problems("optimizer.max_grad_norm=0.5")[0]
    assert "hardware.num_processes = 1" in problems("hardware.num_processes=2")[0]
    assert "precision.mixed = bf16" in problems("precision.mixed=fp16")[0]
    assert "optimizer.name" in problems("optimizer.name=prodigy")[0]
    assert "hardware.strategy = ddp" in problems("hardware.strategy=deepspeed")[0]
    # block swap: one process only
    cfg = load_config(None, ["memory.block_swap=4", "hardware.num_processes=2"])
    assert [p.key for p in rules.problems(cfg)] == ["memory.block_swap"]
    assert rules.problems(load_config(None, ["memory.block_swap=4"])) == []


@pytest.mark.parametrize("name", ["adamw", "sgd", "adafactor", "lion"])
def test_fused_backward_equals_the_ordinary_step(name):
    """Two parameter groups with their own LRs, an LR change between steps (as a schedule makes)."""
    cfg = load_config(None, [f"optimizer.name={name}", "optimizer.lr=1e-2", "optimizer.weight_decay=0.01"])

    def train(fused: bool) -> dict:
        model = Chain()
        blocks = [p for p in model.blocks.parameters()]
        rest = [p for n, p in model.named_parameters() if not n.startswith("blocks.")]
        opt = build_optimizer(cfg, [{"params": blocks, "lr": 1e-2}, {"params": rest, "lr": 3e-3}])
        hooks = FusedBackward(opt, [*blocks, *rest]) if fused else None
        g = torch.Generator().manual_seed(1)
        for step in range(3):
            if step == 1:  # a resume loads the state dict, which replaces the group dicts
                opt.load_state_dict(copy.deepcopy(opt.state_dict()))
            for group in opt.param_groups:
                group["lr"] *= 0.5
            x, y = torch.randn(1, 4, generator=g), torch.randn(1, 4, generator=g)  # batch 1
            torch.nn.functional.mse_loss(model(x), y).backward()
            if fused:
                assert all(p.grad is None for p in model.parameters())  # freed as soon as used
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
        if fused:
            assert hooks.stepped == 3 * len(hooks.handles)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    plain, fused = train(False), train(True)
    assert_same(plain, fused)
    assert any(not torch.equal(plain[k], Chain().state_dict()[k]) for k in plain), "training did not move"


def full_weights(run) -> dict:
    return load_file(str(run / "ft-diffusers" / "unet" / "diffusion_pytorch_model.safetensors"))


def test_full_fine_tune_with_fused_backward_trains_the_same_weights_and_resumes_exactly(tmp_path, tiny_models):
    """A full fine-tune of tiny SD1 (batch 1, accumulation 1, warmup + cosine schedule, EMA saved as the
    output): the fused run writes the ordinary run's weights and LRs; a run resumed from the fused run's
    step-2 checkpoint, with block swap on, writes the same weights again."""
    data = make_dataset(tmp_path / "data", n=3, size=32)
    common = ["network.type=full", "schedule.max_steps=3", "checkpoints.every_n_steps=2", "optimizer.lr=1e-3",
              "optimizer.max_grad_norm=0", "optimizer.scheduler=cosine", "optimizer.warmup_steps=1",
              "ema.enabled=true", "ema.decay=0.5", "network.save_precision=fp32", "output.name=ft"]
    plain, plain_events, _ = train_run(tmp_path / "plain", tiny_models("sd1"), data, "ft", *common)
    fused, fused_events, _ = train_run(tmp_path / "fused", tiny_models("sd1"), data, "ft",
                                       "optimizer.fused_backward=true", *common)
    lrs = lambda events: [(e["step"], e["lr"]) for e in events if e["event"] == "step"]  # noqa: E731
    assert lrs(plain_events) == lrs(fused_events) and len(lrs(plain_events)) == 3
    a, b = full_weights(plain), full_weights(fused)
    assert_same(a, b)
    checkpoint = fused / "checkpoints" / "step-00000002"
    for name in ("full_unet.safetensors", "ema.safetensors"):  # the trained weights and their EMA
        straight = load_file(str(plain / "checkpoints" / "step-00000002" / name))
        assert_same(straight, load_file(str(checkpoint / name)))
    resumed_root = tmp_path / "resumed"
    shutil.copytree(checkpoint, resumed_root / "runs" / "ft" / "checkpoints" / checkpoint.name)
    # resumed with 2 of the UNet's blocks swapped: their weights, optimizer state and EMA live in CPU
    # memory and step on the device copy during the backward (memory.block_swap is safe to change on resume)
    resumed, events, _ = train_run(resumed_root, tiny_models("sd1"), data, "ft", "optimizer.fused_backward=true",
                                   "memory.block_swap=2", *common)
    assert [e["step"] for e in events if e["event"] == "step"] == [3]
    c = full_weights(resumed)
    assert all(torch.equal(b[k], c[k]) for k in b), [k for k in b if not torch.equal(b[k], c[k])][:3]


def test_kohya_import_maps_fused_backward_pass_and_blocks_to_swap():
    from gui.kohya_import import import_kohya
    result = import_kohya({"fused_backward_pass": True, "blocks_to_swap": 8, "max_grad_norm": 0,
                           "optimizer": "Adafactor"})
    assert result.data["optimizer"]["fused_backward"] is True and result.data["memory"]["block_swap"] == 8
    assert rules.problems(result.config()) == []
