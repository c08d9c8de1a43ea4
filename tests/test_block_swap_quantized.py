"""memory.block_swap with a quantized frozen base (model.quantize, training/block_swap.py +
compute/weight_storage.py): swapped blocks of torchao int8/float8 weights and bitsandbytes nf4 weights
(with their quant_state) under peft's LoRA layers really move between their host and device copies, the
Parameter objects stay the same, and a LoRA trained with the swap has the very outputs, gradients and
weights of one trained without it. On a CPU the "device" copy is a second real copy in CPU memory."""
from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model

from trainer_backend.compute.quantize import quantize_module, quantized_kind
from trainer_backend.compute.weight_storage import (copy_storage, install, is_wrapper, leaves, quant_state_leaves,
                                                    quant_state_of, storage_of)
from trainer_backend.training.block_swap import BlockSwap, in_backward
from tests.test_block_swap import Block, Chain, swaps  # noqa: F401  (swaps: the fixture recording every BlockSwap)

KINDS = ["int8", "float8", "nf4"]
WIDTH = 64   # nf4 packs 64-value blocks


def lora_chain(kind: str, checkpointing: bool = False) -> Chain:
    """A chain whose blocks' Linear layers are quantized (the frozen base) with LoRA adapters on them."""
    model = Chain(n=4, width=WIDTH, checkpointing=checkpointing)
    assert quantize_module(model, kind, device="cpu", compute_dtype=torch.float32, keep=("embed", "head")) == 8
    model = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=["a", "b"]), model)
    g = torch.Generator().manual_seed(3)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: give the first step's gradients something to flow through
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def quantized(block: Block) -> list[torch.nn.Parameter]:
    weights = [block.a.base_layer.weight, block.b.base_layer.weight]
    assert all(is_wrapper(w) or quant_state_of(w) is not None for w in weights)  # really quantized
    return weights


def storage_ptrs(w) -> set[int]:
    return {t.data_ptr() for t in (*leaves(storage_of(w)), *quant_state_leaves(quant_state_of(w)))}


def train(model: Chain, swap: int = 0, steps: int = 3, watch=None):
    """AdamW on the adapters; returns (first forward's output, first backward's gradients, final adapter
    weights, the BlockSwap)."""
    params = [p for p in model.parameters() if p.requires_grad]
    assert params and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(params, lr=1e-2)
    swapper = BlockSwap(list(model.blocks), swap, "cpu") if swap else None
    if watch is not None:
        watch(model, swapper)
    g = torch.Generator().manual_seed(1)
    first_out = first_grads = None
    for step in range(steps):
        x, y = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
        out = model(x)
        torch.nn.functional.mse_loss(out, y).backward()
        if step == 0:
            first_out = out.detach().clone()
            first_grads = [p.grad.clone() for p in params]
        opt.step()
        opt.zero_grad(set_to_none=True)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return first_out, first_grads, weights, swapper


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("kind", KINDS)
def test_swapped_quantized_blocks_move_and_train_the_same_lora(kind, checkpointing):
    out, grads, weights, _ = train(lora_chain(kind, checkpointing))
    model = lora_chain(kind, checkpointing)
    objects = {id(w) for block in model.blocks for w in quantized(block)}
    seen = []   # (phase, block, every quantized weight on a copy other than its host copy)

    def watch(model, swapper):
        def probe(k):
            def check(*_):
                home = all(storage_ptrs(w).isdisjoint({t.data_ptr() for t in (*leaves(swapper.host[id(w)]),
                           *quant_state_leaves(swapper.host_states.get(id(w))))}) for w in quantized(model.blocks[k]))
                seen.append(("backward" if in_backward() else "forward", k, home))
            return check
        for k in (2, 3):
            model.blocks[k].register_forward_pre_hook(probe(k))       # after the swap's own pre-hook
            model.blocks[k].b.lora_B.default.weight.register_hook(probe(k))  # during the block's backward

    s_out, s_grads, s_weights, swapper = train(model, swap=2, watch=watch)
    assert torch.equal(out, s_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, s_grads))
    assert weights.keys() == s_weights.keys()
    assert max((weights[n] - s_weights[n]).abs().max().item() for n in weights) <= 1e-6
    # the quantized blocks visited the device copy forward and backward, and nowhere else ...
    assert {(phase, k) for phase, k, _ in seen} == {(p, k) for p in ("forward", "backward") for k in (2, 3)}
    assert all(fetched for *_, fetched in seen)
    fetches = [k for kind_, k in swapper.moves if kind_ == "fetch"]
    assert fetches.count(2) >= 6 and fetches.count(3) >= 6 and not {0, 1} & set(fetches)
    # ... are back on their host copies now, the same Parameter objects, still quantized
    assert not swapper.resident
    for k in (2, 3):
        for w in quantized(model.blocks[k]):
            assert storage_ptrs(w) == {t.data_ptr() for t in (*leaves(swapper.host[id(w)]),
                                                             *quant_state_leaves(swapper.host_states.get(id(w))))}
    assert {id(w) for block in model.blocks for w in quantized(block)} == objects
    assert quantized_kind(model) == kind


@pytest.mark.parametrize("kind", KINDS)
def test_install_points_the_same_parameter_at_another_copy_of_its_quantized_values(kind):
    """What the swap relies on: after `install`, the layer computes with the copy's values (torchao's
    values live in the wrapper's inner tensors, which `param.data = copy` alone would leave in place)."""
    layer = lora_chain(kind).blocks[0].a.base_layer
    w, x = layer.weight, torch.randn(2, WIDTH)
    with torch.no_grad():
        before = layer(x)
        original = storage_of(w)
        install(w, copy_storage(original, torch.zeros_like))
        assert layer.weight is w and isinstance(w, torch.nn.Parameter)
        changed = layer(x)
        install(w, original)
        assert not torch.allclose(changed, before) and torch.equal(layer(x), before)


# A real run: the LoRA of a quantized-base run with block swap, offloaded (quantized) text encoders and VAE
# and gradient checkpointing equals the same quantized run without them. name: (arch, model.quantize,
# model.quantize_text_encoders); Wan 2.2 is the model this is for (its 14B expert on a 24 GB card).
RUNS = {"sd1-nf4-te-nf4": ("sd1", "nf4", "nf4"), "sd1-int8_compute-te-float8": ("sd1", "int8_compute", "float8"),
        "wan22_t2v-int8-te-int8": ("wan22_t2v", "int8", "int8")}


@pytest.mark.parametrize("case", RUNS)
def test_quantized_run_with_block_swap_and_offloaded_encoders_trains_the_same_lora(tmp_path, tiny_models, swaps,
                                                                                   case, monkeypatch):
    from safetensors.torch import load_file

    from tests.conftest import make_dataset
    from tests.method_runs import train_run
    arch, quant, quant_te = RUNS[case]
    data = make_dataset(tmp_path / "data", n=2, size=32)
    # bitsandbytes' CPU inference path (eval mode, on CPUs with AVX512-BF16) repacks nf4 weights in blocks of 64
    # input features, which the tiny models' 32-wide layers do not have (with or without block swap): the
    # training path it takes everywhere else
    import bitsandbytes.nn.modules
    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: False)
    common = ["schedule.max_steps=2", "optimizer.lr=1e-3", "network.dropout=0", f"model.quantize={quant}",
              f"model.quantize_text_encoders={quant_te}", "samples.prompts=a square", "samples.every_n_steps=2",
              "samples.steps=2", "samples.width=32", "samples.height=32"]
    plain, _, _ = train_run(tmp_path, tiny_models(arch), data, "plain", *common)
    assert not swaps
    swapped, events, _ = train_run(tmp_path, tiny_models(arch), data, "swapped", "memory.block_swap=2",
                                   "memory.offload_encoders=true", "precision.gradient_checkpointing=true", *common)
    a, b = (load_file(str(run / f"{run.name}.safetensors")) for run in (plain, swapped))
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    assert any(a[k].abs().max() > 0 for k in a if "lora_up" in k or "lora_B" in k), "training did not move"
    assert any(e["event"] == "sample" for e in events)
    log = (swapped / "train.log").read_text()
    assert f"model.quantize = {quant}:" in log and f"model.quantize_text_encoders = {quant_te}:" in log
    denoiser = next(s for s in swaps if s.prefetch)
    quantized_weights = [t for k in denoiser.swapped for t in denoiser.tensors[k]
                         if is_wrapper(t) or quant_state_of(t) is not None or t.dtype in (torch.int8, torch.float8_e4m3fn)]
    assert quantized_weights, "the swapped blocks hold no quantized weight"
    for k in denoiser.swapped:  # forward and backward of each step, and the samples' forwards
        assert [kind for kind, j in denoiser.moves if j == k].count("fetch") >= 5
    encoders = [s for s in swaps if s is not denoiser]
    text_encoders = [s for s in encoders if any(is_wrapper(t) or quant_state_of(t) is not None
                                                for ts in s.tensors.values() for t in ts)]
    assert text_encoders and all(s.moves for s in text_encoders)   # the quantized encoders moved for their calls
    assert not denoiser.resident and all(not e.resident for e in encoders), [
        (type(e.blocks[0]).__name__, list(e.resident), len(e.blocks)) for e in encoders]


def test_the_memory_plan_counts_swapped_blocks_at_their_quantized_size():
    """Wan 2.2's 24 GB settings: the denoiser bytes left on the GPU with N blocks swapped are the quantized
    weights' bytes less the swapped blocks' share, and the blocks in flight are counted quantized too."""
    from pathlib import Path

    from gui.presets import PresetStore
    from trainer_backend.launch.memory_plan import plan_memory
    from trainer_backend.launch.memory_tables import family_table, weight_bytes
    root = Path(__file__).resolve().parents[1]
    base = PresetStore(user_dir=root / "presets" / "no-user-presets").load("wan22-t2v-lora-24gb")

    def plan(quant: str, swap: int):
        cfg = base.model_copy(deep=True)
        cfg.model.quantize, cfg.memory.block_swap = quant, swap
        return plan_memory(cfg)
    table = family_table("wan22_t2v")
    den = table["components"][table["denoiser"]]
    blocks = den["blocks"]
    for quant in ("none", "int8", "nf4"):
        stored = weight_bytes(den, "bf16", quant)
        share = sum(blocks[-20:]) / den["params"]
        assert plan(quant, 20).resident["denoiser"] == pytest.approx(stored * (1 - share))
    bf16, int8 = plan("none", 20), plan("int8", 20)
    assert int8.resident["denoiser"] < 0.55 * bf16.resident["denoiser"]
    # the two swapped blocks on the GPU during the forward/backward, quantized: the step's peak falls by more
    # than the resident bytes alone
    assert (bf16.phases["forward/backward"] - int8.phases["forward/backward"]) > 0
