"""Wan 2.2's frozen expert (the one model.expert does not train) under the run's memory options
(training/sampling_residency.py): stored as the frozen base (model.quantize) in host memory, and with
memory.block_swap or offload_encoders its blocks visit the device one at a time while samples are drawn, its
small non-block parts moved for the round; the samples equal those drawn without the swap. On a CPU the
"device" copy of a fetched block is a second real copy in CPU memory (training/block_swap.py)."""
from __future__ import annotations

import types

import pytest
import torch

from trainer_backend.compute.quantize import quantized_kind
from trainer_backend.compute.weight_storage import is_wrapper, leaves, storage_of
from trainer_backend.training import sampling_residency
from tests.test_block_swap import swaps  # noqa: F401  (the fixture recording every BlockSwap a run makes)

BLOCKS = 4   # per expert: more than a swap keeps on the device at once (the block running + the one prefetched)
DEVICE = torch.device("cpu")


@pytest.fixture(scope="module")
def wan4(tmp_path_factory):
    """A tiny Wan 2.2 T2V folder whose experts have four blocks each."""
    from trainer_backend.families.wan.tiny import build_tiny_wan
    return build_tiny_wan(tmp_path_factory.mktemp("wan4") / "model", layers=BLOCKS)


def placed_model(folder, *overrides, expert="high"):
    """The model as a run places it (encoders, denoiser, the frozen expert; the trained expert's own swap)."""
    from trainer_backend.config import load_config
    from trainer_backend.families.registry import get_family
    from trainer_backend.training.memory_setup import install_after_prepare
    from trainer_backend.training.setup import place_model
    cfg = load_config(None, [f"model.path={folder}", "hardware.cpu=true", "precision.mixed=no", *overrides])
    model = get_family("wan22_t2v").load(folder, expert=expert)
    place_model(model, cfg, types.SimpleNamespace(device=DEVICE))
    installed = install_after_prepare(cfg, model, None, None, DEVICE)
    return model, installed.get("block_swap")


def draw(model) -> torch.Tensor:
    """Latents of one sample clip: 4 Euler steps with guidance, over both experts (boundary 0.875)."""
    from trainer_backend.diffusion.sampling import run_on, sampling_parts
    with torch.no_grad(), sampling_parts(model):
        pipe = run_on(model.family.build_pipeline(model), DEVICE)
        return pipe(prompt="a red square", negative_prompt="", num_frames=5, width=32, height=32,
                    num_inference_steps=4, guidance_scale=2.0, generator=torch.Generator().manual_seed(0),
                    output_type="latent").frames


def most_resident(moves) -> int:
    """The most blocks a BlockSwap held on the device at once, replayed from its moves."""
    held, most = set(), 0
    for kind, k in moves:
        (held.add if kind == "fetch" else held.discard)(k)
        most = max(most, len(held))
    return most


def on_host_copy(swap, t) -> bool:
    """Weight t reads its values from its host copy (not from a copy fetched for the device)."""
    return [x.data_ptr() for x in leaves(storage_of(t))] == [x.data_ptr() for x in leaves(swap.host[id(t)])]


@pytest.fixture
def whole_moves(monkeypatch):
    """Every call of sampling_residency.move: (device, ids of the tensors it moved)."""
    calls = []
    real = sampling_residency.move

    def recorded(tensors, device):
        calls.append((torch.device(device), {id(t) for t in tensors}))
        real(tensors, device)
    monkeypatch.setattr(sampling_residency, "move", recorded)
    return calls


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_the_frozen_expert_samples_one_block_at_a_time_and_draws_the_same(wan4, whole_moves, quantize):
    plain, no_swap = placed_model(wan4, f"model.quantize={quantize}")
    assert no_swap is None and not plain.sampling_placement.__self__.streamed
    expected = draw(plain)

    model, trained_swap = placed_model(wan4, f"model.quantize={quantize}", "memory.block_swap=2")
    other = model.options["other_expert"]
    residency = model.sampling_placement.__self__
    assert residency.streamed and not residency.swaps  # the frozen expert's swap is made at the first round
    whole_moves.clear()
    got = draw(model)
    assert torch.allclose(got, expected, atol=1e-6, rtol=0), (got - expected).abs().max()

    (frozen,) = residency.swaps
    assert frozen.blocks == list(other.blocks) and frozen.swapped == set(range(BLOCKS)) and frozen.prefetch
    fetched = [k for kind, k in frozen.moves if kind == "fetch"]
    assert set(fetched) == set(range(BLOCKS)) and len(fetched) >= 2 * BLOCKS   # it ran, with and without the prompt
    assert most_resident(frozen.moves) == 2 < BLOCKS, list(frozen.moves)   # never the whole expert on the device
    assert not frozen.resident and all(on_host_copy(frozen, t) for ts in frozen.tensors.values() for t in ts)
    # the non-block parts (embeddings, output head) came in for the round and went home; no block moved whole
    block_ids = {id(t) for b in other.blocks for t in (*b.parameters(), *b.buffers())}
    rest = {id(t) for t in (*other.parameters(), *other.buffers())} - block_ids
    assert [(d.type, ids) for d, ids in whole_moves] == [(DEVICE.type, rest), ("cpu", rest)]
    # the trained expert kept its own swap
    assert trained_swap is not None and trained_swap.blocks == list(model.denoiser.blocks)
    assert trained_swap.moves and not trained_swap.resident

    linears = [m for b in other.blocks for m in b.modules() if isinstance(m, torch.nn.Linear)]
    if quantize == "int8":   # stored quantized like the trained expert's base, in host memory
        assert quantized_kind(other) == "int8" and all(is_wrapper(m.weight) for m in linears)
        from trainer_backend.compute.quantize import weight_bytes
        stored = sum(weight_bytes(m) - (m.bias.numel() * 4 if m.bias is not None else 0) for m in linears)
        assert stored < 0.4 * sum(m.weight.numel() * 4 for m in linears)   # int8 + a row scale vs fp32
    else:
        assert quantized_kind(other) == "" and all(m.weight.dtype == torch.float32 for m in linears)


def test_without_memory_options_the_frozen_expert_comes_whole_and_draws_as_a_model_outside_a_run(wan4,
                                                                                               whole_moves):
    """No swap: the whole expert comes for the round (fast on a big card) and goes home; the samples equal
    those of a tool that draws from the loaded model (build_pipeline moving the expert itself)."""
    from trainer_backend.families.registry import get_family
    model, _ = placed_model(wan4, expert="low")
    got = draw(model)
    other = model.options["other_expert"]
    everything = {id(t) for t in (*other.parameters(), *other.buffers())}
    assert [(d.type, ids) for d, ids in whole_moves] == [(DEVICE.type, everything), ("cpu", everything)]
    loaded = get_family("wan22_t2v").load(wan4, expert="low")   # no run: no placement
    assert loaded.sampling_placement is None
    assert torch.equal(draw(loaded), got)


def test_offloaded_encoders_stream_the_frozen_expert_too(wan4):
    model, trained_swap = placed_model(wan4, "memory.offload_encoders=true", expert="low")
    assert trained_swap is None
    draw(model)
    (frozen,) = model.sampling_placement.__self__.swaps
    assert frozen.blocks == list(model.options["other_expert"].blocks)   # expert=low: the high-noise one is frozen
    assert most_resident(frozen.moves) == 2 and not frozen.resident


def test_a_run_with_block_swap_and_an_int8_base_samples_with_the_frozen_expert_streamed(tmp_path, wan4, swaps):
    """Through the loop: model.expert = low trains transformer_2; the high-noise expert, stored int8, comes block by
    block for the samples after the trained expert's own swap is installed; the clip is written."""
    from tests.conftest import make_dataset
    from tests.method_runs import train_run
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, events, _ = train_run(tmp_path, wan4, data, "run", "model.expert=low", "model.quantize=int8",
                               "memory.block_swap=2", "memory.offload_encoders=true", "schedule.max_steps=2",
                               "samples.prompts=a square --f 5", "samples.every_n_steps=2", "samples.steps=4",
                               "samples.width=32", "samples.height=32", "samples.check_adapter_effect=false")
    (sample,) = [e for e in events if e["event"] == "sample"]
    assert any(p.endswith(".mp4") for p in sample["paths"])
    trained, frozen = [s for s in swaps if s.prefetch]   # the trained expert's swap first, then the frozen one's
    assert len(trained.swapped) == 2 and frozen.swapped == set(range(BLOCKS))
    weights = [t for ts in frozen.tensors.values() for t in ts if t.dim() == 2]   # the blocks' Linear weights
    assert weights and all(is_wrapper(t) for t in weights)
    assert {k for kind, k in frozen.moves if kind == "fetch"} == set(range(BLOCKS))
    assert most_resident(frozen.moves) == 2 and not frozen.resident
    assert "only sample (WanTransformer3DModel)" in (run / "train.log").read_text()


def test_a_full_fine_tunes_frozen_expert_waits_in_the_compute_dtype_not_in_fp32(wan4):
    """The trained expert keeps fp32 masters; the frozen one only samples (under autocast): bf16, half the bytes."""
    model, _ = placed_model(wan4, "network.type=full", "precision.mixed=bf16")
    assert {p.dtype for p in model.denoiser.parameters()} == {torch.float32}
    assert {p.dtype for p in model.options["other_expert"].parameters()} == {torch.bfloat16}
    from trainer_backend.diffusion.sampling import generate, sampling_parts
    with torch.no_grad(), sampling_parts(model):
        pipe = model.family.build_pipeline(model)
        (clip,) = generate(pipe, DEVICE, torch.bfloat16, prompt="a red square", num_frames=5, width=32, height=32,
                           num_inference_steps=4, guidance_scale=2.0, generator=torch.Generator().manual_seed(0))
    assert clip.shape == (5, 32, 32, 3) and clip.std() > 0
