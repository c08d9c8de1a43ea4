"""precision.attention's checked kernels (training/attention_backends.py): each is checked once per shape
against the math kernel, forward and backward, before use; a kernel that is unavailable (on this CPU:
sdpa_efficient, sdpa_cudnn_only, FlashAttention without its package) or wrong falls back to PyTorch's choice
with one log line, and the choice is logged."""
import importlib.util
import logging

import pytest
import torch
import torch.nn.functional as F

from conftest import make_dataset
from method_runs import train_run
from test_quantized_base import losses
from trainer_backend.training import attention_backends
from trainer_backend.training.attention_backends import using

ORIGINAL = F.scaled_dot_product_attention


@pytest.fixture(autouse=True)
def restore():
    yield
    attention_backends.use("")
    assert F.scaled_dot_product_attention is ORIGINAL


def qkv(tokens=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, tokens, 8, generator=g) for _ in range(3)]


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision.attention")]


def test_a_kernel_that_passes_its_check_is_used_and_logged_once_per_shape(caplog):
    q, k, v = qkv()
    with caplog.at_level(logging.INFO, logger="trainer"), using("sdpa_flash"):   # PyTorch has a CPU flash kernel
        first = F.scaled_dot_product_attention(q, k, v)
        F.scaled_dot_product_attention(q, k, v)
        F.scaled_dot_product_attention(*qkv(tokens=24))
    lines = messages(caplog)
    assert len(lines) == 2 and all("using it" in line for line in lines), lines
    assert "2x3x16x8 float32" in lines[0] and "2x3x24x8" in lines[1]
    assert torch.allclose(first, ORIGINAL(q, k, v), atol=1e-5)


@pytest.mark.parametrize("choice, why", [("sdpa_efficient", "No viable backend"),
                                         ("sdpa_cudnn_only", "No viable backend"),
                                         ("flash_attn2", "flash_attn package is not installed")])
def test_an_unavailable_kernel_falls_back_with_one_line(caplog, choice, why):
    if choice == "flash_attn2" and importlib.util.find_spec("flash_attn"):
        pytest.skip("flash_attn is installed here")
    q, k, v = qkv()
    q.requires_grad_(True)
    with caplog.at_level(logging.INFO, logger="trainer"), using(choice):
        out = F.scaled_dot_product_attention(q, k, v)
        out.sum().backward()
        F.scaled_dot_product_attention(q, k, v)
    lines = messages(caplog)
    assert len(lines) == 1 and f"precision.attention = {choice}: not used at 2x3x16x8" in lines[0], lines
    assert why in lines[0] and "PyTorch's SDPA choice" in lines[0]
    assert torch.equal(out, ORIGINAL(q, k, v)) and q.grad is not None


def test_a_kernel_that_computes_wrong_values_fails_its_check_and_is_not_used(caplog, monkeypatch):
    real = attention_backends.run_kernel

    def off_by_a_bit(choice, *args, **kwargs):   # a kernel bug: the output 10 % too large
        return real(choice, *args, **kwargs) * 1.1
    monkeypatch.setattr(attention_backends, "run_kernel", off_by_a_bit)
    q, k, v = qkv()
    with caplog.at_level(logging.INFO, logger="trainer"), using("sdpa_flash"):
        out = F.scaled_dot_product_attention(q, k, v)
    lines = messages(caplog)
    assert len(lines) == 1 and "not used" in lines[0] and "largest relative error 1.0e-01" in lines[0], lines
    assert torch.equal(out, ORIGINAL(q, k, v))


def test_training_logs_the_choice_and_a_fallback_trains_as_sdpa(tmp_path, tiny_models):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    model_dir = tiny_models("sd1")
    steps = ["schedule.max_steps=2", "optimizer.lr=1e-2"]
    _, base_events, _ = train_run(tmp_path / "a", model_dir, data, "a", *steps)
    run, events, _ = train_run(tmp_path / "b", model_dir, data, "a", *steps, "precision.attention=sdpa_efficient")
    log = (run / "train.log").read_text()
    assert "precision.attention = sdpa_efficient: not used at" in log and "No viable backend" in log
    assert losses(events) == losses(base_events)


def test_a_kernel_checked_inside_a_checkpointed_block_trains(tmp_path, tiny_models):
    """With gradient checkpointing the first forward of a shape runs the check inside the checkpointed block
    and the recomputation does not: the check's own saved tensors must not count as the block's ("A different
    number of tensors was saved", found by bench/gpu.py's CPU check of flux-options/ours/sdpa-flash)."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    steps = ["schedule.max_steps=2", "precision.gradient_checkpointing=true"]
    _, base_events, _ = train_run(tmp_path / "a", tiny_models("flux"), data, "a", *steps)
    run, events, _ = train_run(tmp_path / "b", tiny_models("flux"), data, "a", *steps, "precision.attention=sdpa_flash")
    assert "precision.attention = sdpa_flash: checked at" in (run / "train.log").read_text()
    assert losses(events) == pytest.approx(losses(base_events), rel=1e-4)
