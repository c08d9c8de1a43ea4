"""memory.block_swap (training/block_swap.py): swapped blocks are really moved between their uses, forward
and backward, and training with them gives the very weights training without them gives; the families
declare their blocks; a real run with block swap and offloaded encoders trains the same LoRA."""
from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import make_dataset
from tests.method_runs import train_run
from trainer_backend.families.registry import FAMILY_NAMES, entry
from trainer_backend.training.block_swap import BlockSwap, in_backward
from trainer_backend.training.fused_backward import FusedBackward


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, width), torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(self.norm(x))))


class Chain(torch.nn.Module):
    def __init__(self, n: int = 5, width: int = 16, checkpointing: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(4, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(n))
        self.head = torch.nn.Linear(width, 4)
        self.checkpointing = checkpointing

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False) if self.checkpointing else block(h)
        return self.head(h)


def train_chain(model: Chain, steps: int = 3, swap: int = 0, fused: bool = False, accum: int = 1,
                frozen_blocks: bool = False, watch=None):
    """AdamW on a fixed regression task; returns (final weights, the BlockSwap)."""
    if frozen_blocks:  # a frozen base with small trained parts, as with adapters
        for block in model.blocks:
            block.a.requires_grad_(False)
            block.norm.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    swapper = BlockSwap(list(model.blocks), swap, "cpu", optimizer=opt if fused else None) if swap else None
    if watch is not None:
        watch(model, swapper)
    if fused:
        FusedBackward(opt, params)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _ in range(accum):
            x, y = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
            (torch.nn.functional.mse_loss(model(x), y) / accum).backward()
        if not fused:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, swapper


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-6, worst


@pytest.mark.parametrize("case", ["full", "frozen_base", "accum2", "fused", "checkpointing", "fused_checkpointing"])
def test_block_swap_trains_the_same_weights_and_moves_each_block_around_its_use(case):
    opts = {"full": {}, "frozen_base": {"frozen_blocks": True}, "accum2": {"accum": 2}, "fused": {"fused": True},
            "checkpointing": {}, "fused_checkpointing": {"fused": True}}[case]
    checkpointing = "checkpointing" in case
    reference, _ = train_chain(Chain(checkpointing=checkpointing), **opts)
    seen = []  # (phase, block, on the device copy?, swapped blocks resident)

    def watch(model, swapper):
        def probe(k):
            def check(*_):
                block = model.blocks[k]
                fetched = all(p.data_ptr() != swapper.host[id(p)].data_ptr() for p in block.parameters())
                seen.append(("backward" if in_backward() else "forward", k, fetched, len(swapper.resident)))
            return check
        for k in (3, 4):
            model.blocks[k].register_forward_pre_hook(probe(k))  # runs after the swap's own pre-hook
            model.blocks[k].b.weight.register_hook(probe(k))  # its gradient: during the block's backward

    swapped, swapper = train_chain(Chain(checkpointing=checkpointing), swap=2, watch=watch, **opts)
    assert_same(reference, swapped)
    # each swapped block was on the device copy whenever it ran, forward and backward ...
    assert {(phase, k) for phase, k, _, _ in seen} == {(p, k) for p in ("forward", "backward") for k in (3, 4)}
    assert all(fetched for _, _, fetched, _ in seen)
    assert max(resident for *_, resident in seen) <= 2  # the running block and the next one at most
    # ... and back on its host copy between steps, every gradient and optimizer state with it
    model_blocks = swapper.blocks
    for k in (3, 4):
        for p in model_blocks[k].parameters():
            assert p.data_ptr() == swapper.host[id(p)].data_ptr()
    assert not swapper.resident
    steps = 3 * opts.get("accum", 1)
    fetches = [k for kind, k in swapper.moves if kind == "fetch"]
    offloads = [k for kind, k in swapper.moves if kind == "offload"]
    assert fetches.count(3) >= 2 * steps and offloads.count(3) >= 2 * steps  # forward and backward, every pass
    assert 0 not in fetches + offloads  # resident blocks never move


def test_block_swap_without_gradients_moves_blocks_and_changes_nothing():
    model = Chain()
    x = torch.randn(2, 4)
    with torch.no_grad():
        before = model(x)
    swapper = BlockSwap(list(model.blocks), 3, "cpu")
    with torch.no_grad():
        after = model(x)
    assert torch.equal(before, after)
    assert list(swapper.moves) == [("fetch", 2), ("fetch", 3), ("offload", 2), ("fetch", 4), ("offload", 3),
                             ("offload", 4)]
    assert not swapper.resident


def test_block_swap_refuses_more_blocks_than_there_are():
    with pytest.raises(ValueError, match="1..5"):
        BlockSwap(list(Chain().blocks), 6, "cpu")


# One family per family package (registry entry.module): block swap and encoder offload are the same
# generic code for all (training/block_swap.py, memory_setup.py); what differs is the family's own code:
# its blocks(), its denoiser class, its encoders and conditioning. Families sharing a package share all
# of that (SD1/SD2/SDXL: families/sd, one UNet class, one blocks(); Qwen-Image and Qwen-Image-Edit:
# families/qwen_image, one transformer class), so the run takes the last one registered there, the one
# that does the most: SDXL (two text encoders, added time conditioning), Qwen-Image-Edit (control
# images in training and samples). A new family package is checked here for free.
FAMILIES = list({entry(name).module: name for name in FAMILY_NAMES}.values())


@pytest.fixture
def swaps(monkeypatch):
    """Every BlockSwap a run makes (the real class, recorded as it is built)."""
    from trainer_backend.training import block_swap, memory_setup
    made = []

    class Recorded(BlockSwap):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
            self.calls = []  # the blocks' forward calls in the order they ran (training passes)
            for k, block in enumerate(self.blocks):
                block.register_forward_pre_hook(self.record(k))

        def record(self, k):
            def hook(*_):
                if torch.is_grad_enabled() and not in_backward():
                    self.calls.append(k)
            return hook

    monkeypatch.setattr(block_swap, "BlockSwap", Recorded)
    monkeypatch.setattr(memory_setup, "BlockSwap", Recorded)
    return made


@pytest.mark.parametrize("arch", FAMILIES)
def test_lora_run_with_block_swap_and_offloaded_encoders_trains_the_same_lora(tmp_path, tiny_models, swaps, arch):
    """A LoRA run with 2 swapped blocks (1 where the tiny model has one), gradient checkpointing (blocks recomputed in the backward) and
    the VAE and text encoders in CPU memory (samples made through the pipeline too) writes the same LoRA
    as a plain run, and the blocks really moved."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    prompt, pairs = "a square", []
    if entry(arch).control_images == "required":  # an edit model trains on pairs and samples with a control image
        control = make_dataset(tmp_path / "control", n=2, size=32, seed=7)
        prompt, pairs = f"a square --control {sorted(control.glob('*.png'))[0]}", [f"dataset.control_path={control}"]
    common = [*pairs, "schedule.max_steps=1", "optimizer.lr=1e-3", "network.dropout=0", f"samples.prompts={prompt}",
              "samples.every_n_steps=1", "samples.steps=2", "samples.width=32", "samples.height=32"]
    from trainer_backend.families import load_model
    loaded = load_model(str(tiny_models(arch)), arch)
    count = min(2, len(loaded.family.blocks(loaded)))  # some tiny models have a single block
    del loaded
    plain, _, _ = train_run(tmp_path, tiny_models(arch), data, "plain", *common)
    assert not swaps
    swapped, events, _ = train_run(tmp_path, tiny_models(arch), data, "swapped", f"memory.block_swap={count}",
                                   "memory.offload_encoders=true", "precision.gradient_checkpointing=true", *common)
    a, b = load_file(str(plain / "plain.safetensors")), load_file(str(swapped / "swapped.safetensors"))
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-6, worst
    assert any(a[k].abs().max() > 0 for k in a if "lora_up" in k or "lora_B" in k), "training did not move"
    assert any(e["event"] == "sample" for e in events)
    denoiser = next(s for s in swaps if s.prefetch)
    encoders = [s for s in swaps if s is not denoiser]
    assert len(denoiser.swapped) == count and len(encoders) >= 2  # the VAE and at least one text encoder
    # the family's blocks() lists every block once, in the order the forward runs them (what makes
    # "every later block is done" true when the backward reaches a block)
    blocks = len(denoiser.blocks)
    assert denoiser.calls == list(range(blocks)) * (len(denoiser.calls) // blocks) and denoiser.calls
    for k in denoiser.swapped:  # the step's forward and backward, and the samples' forwards
        assert [kind for kind, j in denoiser.moves if j == k].count("fetch") >= 3
    assert not denoiser.resident and all(not e.resident for e in encoders)
    assert all(e.moves for e in encoders)  # each offloaded module came to the device for its calls


def test_more_swapped_blocks_than_the_denoiser_has_is_refused_naming_the_key():
    """The default Family.blocks(): the children of the denoiser's top-level ModuleLists."""
    from types import SimpleNamespace

    from trainer_backend.config import ConfigError, load_config
    from trainer_backend.families.base import Family
    from trainer_backend.training.memory_setup import swapped_blocks
    family = Family()
    family.label = "A chain"
    model = SimpleNamespace(denoiser=Chain(), family=family)
    assert family.blocks(model) == list(model.denoiser.blocks)
    assert swapped_blocks(load_config(None, ["memory.block_swap=2"]), model) == list(model.denoiser.blocks)[3:]
    with pytest.raises(ConfigError, match=r"^memory.block_swap: A chain's denoiser has 5 blocks.*got 6"):
        swapped_blocks(load_config(None, ["memory.block_swap=6"]), model)
