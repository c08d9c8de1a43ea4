"""optimizer.fused (training/optimizers.py): PyTorch's fused AdamW/SGD kernel trains the weights the default
implementation trains (up to rounding), continues from a checkpoint the default one saved (a resume that turns it
on), and is refused naming the key where no fused kernel exists or precision.full_bf16 owns the update."""
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
    (half,) = problems("precision.full_bf16=true")
    assert half.startswith("optimizer.fused:") and "precision.full_bf16" in half


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
                assert all(group["fused"] for group in opt.param_groups)
                opt.load_state_dict(state)
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
