"""optimizer.fused (training/optimizers.py): PyTorch's fused AdamW/SGD kernel trains the weights the default
implementation trains (up to rounding), continues from a checkpoint the default one saved (a resume that turns it
on), steps bf16 weights as precision.full_bf16's own AdamW does with nearest rounding (and trades checkpoints with
it), and is refused naming the key where no fused kernel fits."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.test_block_swap import Chain
from trainer_backend.config import load_config, rules
from trainer_backend.training.optimizers import build_optimizer


def problems(*overrides: str) -> list[str]:
    return [str(p) for p in rules.problems(load_config(None, ["optimizer.fused=true", *overrides]))]


def test_fused_optimizer_refusals_name_the_key():
    assert problems() == [] and problems("optimizer.name=sgd") == []
    (other,) = problems("optimizer.name=lion")
    assert other.startswith("optimizer.fused:") and "'lion'" in other and "adamw and sgd" in other
    (rounding,) = problems("precision.full_bf16=true")
    assert rounding.startswith("optimizer.fused:") and 'half_weights_rounding = "nearest" (got "stochastic")' in rounding
    assert problems("precision.full_bf16=true", 'precision.half_weights_rounding="nearest"') == []
    (sgd,) = problems("precision.full_bf16=true", 'precision.half_weights_rounding="nearest"', "optimizer.name=sgd")
    assert "'sgd'" in sgd and "adamw" in sgd
    half = problems("precision.full_fp16=true", "precision.mixed=fp16")
    assert any(p.startswith("optimizer.fused:") and "full_fp16" in p for p in half)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_fused_optimizer_trains_the_same_weights_and_takes_a_default_checkpoint(name):
    """Two groups with their own LRs; after two steps the state is saved by the default optimizer and loaded into
    the fused one (a resume that switches optimizer.fused on), then two more steps."""
    def optimizer(model: Chain, fused: bool) -> torch.optim.Optimizer:
        cfg = load_config(None, [f"optimizer.name={name}", "optimizer.lr=1e-2", "optimizer.weight_decay=0.01",
                                 f"optimizer.fused={str(fused).lower()}"])
        blocks = list(model.blocks.parameters())
        rest = [p for n, p in model.named_parameters() if not n.startswith("blocks.")]
        return build_optimizer(cfg, [{"params": blocks, "lr": 1e-2}, {"params": rest, "lr": 3e-3}])

    def train(switch_to_fused: bool) -> dict:
        model = Chain()
        opt = optimizer(model, fused=False)
        g = torch.Generator().manual_seed(1)
        for step in range(4):
            if step == 2 and switch_to_fused:
                state = copy.deepcopy(opt.state_dict())
                opt = optimizer(model, fused=True)
                opt.load_state_dict(state)
                assert all(group["fused"] for group in opt.param_groups), "the checkpoint's flag won"
            x, y = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    plain, fused = train(False), train(True)
    start = Chain().state_dict()
    for key in plain:
        assert torch.allclose(plain[key], fused[key], rtol=0, atol=1e-6), key
    assert all(not torch.equal(plain[k], start[k]) for k in plain), "training did not move every weight"


def test_fused_adamw_steps_bf16_weights_like_full_bf16_nearest_and_trades_checkpoints_with_it():
    """precision.full_bf16 with nearest rounding: our HalfWeightsAdamW throughout, against a run that switches to
    the fused kernel after two steps and back after four (resumes in both directions)."""
    def optimizer(model: Chain, fused: bool) -> torch.optim.Optimizer:
        cfg = load_config(None, ["precision.full_bf16=true", 'precision.half_weights_rounding="nearest"',
                                 "optimizer.lr=1e-2", "optimizer.weight_decay=0.01", f"optimizer.fused={str(fused).lower()}"])
        return build_optimizer(cfg, [{"params": list(model.parameters()), "lr": 1e-2}])

    def train(switch: bool) -> dict:
        model = Chain().to(torch.bfloat16)
        opt = optimizer(model, fused=False)
        g = torch.Generator().manual_seed(1)
        for step in range(6):
            if switch and step in (2, 4):
                state = copy.deepcopy(opt.state_dict())
                saved = copy.deepcopy(state)
                opt = optimizer(model, fused=step == 2)
                assert type(opt) is (torch.optim.AdamW if step == 2 else type(optimizer(Chain(), False)))
                opt.load_state_dict(state)
                assert step == 4 or all(group["fused"] for group in opt.param_groups), "the checkpoint's flag won"
                assert [g.get("fused") for g in state["param_groups"]] == [g.get("fused") for g in saved["param_groups"]]
                assert all(type(state["state"][k]["step"]) is type(saved["state"][k]["step"]) for k in saved["state"])
            x, y = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
            torch.nn.functional.mse_loss(model(x.bfloat16()).float(), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        return {k: v.detach().float() for k, v in model.state_dict().items()}

    ours, switched = train(False), train(True)
    start = {k: v.float() for k, v in Chain().to(torch.bfloat16).state_dict().items()}
    for key in ours:  # the same rule in fp32 arithmetic; one bf16 step apart at most where a rounding tie fell
        spacing = ours[key].abs().clamp_min(1e-3) * 2 ** -7
        assert ((ours[key] - switched[key]).abs() <= spacing).all(), key
        assert not torch.equal(switched[key], start[key]), key
