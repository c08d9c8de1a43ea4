"""Catch a LoRA that learned nothing (issue 33, items 3-4): the adapter-effect measure at each sample round
and at the end, the warning event, and a NaN loss that stops the run naming the last good checkpoint."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.diffusion.adapter_effect import EFFECT_FLOOR, findings, is_flat, mean_abs_difference

COMMON = ["schedule.max_steps=3", "dataset.resolution=32", "samples.every_n_steps=2",
          'samples.prompts="a red square --s 2 --w 32 --h 32"']


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 255), st.integers(0, 255), st.integers(1, 8), st.integers(1, 8))
def test_difference_is_the_mean_absolute_pixel_gap(a, b, h, w):
    x = np.full((h, w, 3), a, np.uint8)
    y = np.full((h, w, 3), b, np.uint8)
    assert mean_abs_difference(x, y) == pytest.approx(abs(a - b) / 255)
    assert mean_abs_difference(x, x) == 0.0
    assert is_flat(x)


def test_findings_final_only_for_a_weak_effect():
    noisy = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    assert not is_flat(noisy)
    assert findings(0.0, 0.0, False, 5, final=False) == []  # early rounds may rightly change little
    (weak,) = findings(EFFECT_FLOOR / 2, 1e-9, False, 5, final=True)
    assert weak.cause == "no_effect" and "learning rate too low or targets wrong?" in weak.message
    assert findings(EFFECT_FLOOR * 2, 1.0, False, 5, final=True) == []
    assert [f.cause for f in findings(float("nan"), float("nan"), True, 7, final=True)] == \
        ["not_finite", "constant_image"]


def _events(run):
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_near_zero_lr_warns_and_a_normal_run_does_not(tmp_path, tiny_models):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    model = tiny_models("sd1")
    run, events, _ = train_run(tmp_path, model, data, "frozen", *COMMON, "optimizer.lr=1e-12")
    warnings = [e for e in events if e["event"] == "warning"]
    assert [w["cause"] for w in warnings] == ["no_effect"]
    assert "barely changes the output" in warnings[0]["message"]
    sample = [e for e in events if e["event"] == "sample"][0]
    assert sample["adapter_effect"] < EFFECT_FLOOR
    (end,) = [e for e in events if e["event"] == "adapter_effect"]
    assert end["step"] == 3 and end["adapter_effect"] < EFFECT_FLOOR
    assert [e["event"] for e in events][-1] == "done"  # a warning, and the run still finishes

    run, events, _ = train_run(tmp_path, model, data, "learns", *COMMON, "optimizer.lr=1e-2")
    assert not [e for e in events if e["event"] == "warning"]
    (end,) = [e for e in events if e["event"] == "adapter_effect"]
    assert end["adapter_effect"] > EFFECT_FLOOR and end["adapter_norm"] > 0


def test_nan_loss_stops_naming_the_last_good_checkpoint_which_resumes(tmp_path, tiny_models, monkeypatch):
    """A NaN injected into the loss at step 3 (checkpoints every 2 steps): the run stops with exit 1, an
    `error` event naming the step, the causes and checkpoints/step-00000002; starting again resumes there."""
    import torch
    from accelerate.state import AcceleratorState
    from trainer_backend import __main__ as cli
    from trainer_backend.training import loop

    data = make_dataset(tmp_path / "data", n=2, size=32)
    args = ["train"] + [a for o in [f"model.path={tiny_models('sd1')}", f"dataset.path={data}",
                                    f"output.dir={tmp_path / 'runs'}", "output.name=diverged", "dataset.resolution=32",
                                    "precision.mixed=no", "network.rank=4", "hardware.cpu=true",
                                    "logging.tensorboard=false", "schedule.max_steps=4",
                                    "checkpoints.every_n_steps=2"] for a in ("--set", o)]
    real_loss, calls = loop.method_loss, []

    def poisoned(*a, **k):
        batch_loss = real_loss(*a, **k)

        def loss(batch, **kw):
            calls.append(1)
            value = batch_loss(batch, **kw)
            return value * float("nan") if len(calls) == 3 else value
        return loss
    monkeypatch.setattr(loop, "method_loss", poisoned)
    AcceleratorState._reset_state(reset_partial_state=True)
    assert cli.main(args) == 1
    run = tmp_path / "runs" / "diverged"
    (error,) = [e for e in _events(run) if e["event"] == "error"]
    assert "loss became nan at step 3" in error["message"] and "bf16" not in error["message"]
    assert "optimizer.lr" in error["message"]
    assert f"last good checkpoint is {run / 'checkpoints' / 'step-00000002'}" in error["message"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000002"]

    monkeypatch.setattr(loop, "method_loss", real_loss)
    AcceleratorState._reset_state(reset_partial_state=True)
    assert cli.main(args) == 0
    AcceleratorState._reset_state(reset_partial_state=True)
    events = _events(run)
    assert [e["step"] for e in events if e["event"] == "resumed"] == [2]
    assert events[-1]["event"] == "done" and events[-1]["step"] == 4
    assert torch.isfinite(torch.tensor([e["loss"] for e in events if e["event"] == "step"][-2:])).all()


def test_run_page_shows_the_warning_and_the_effect(tmp_path):
    """The Run page's progress box carries the warning (once per cause), the artifacts the end's measure."""
    from gui import run_monitor as rm
    from gui.run_state import fold_events
    message = "the LoRA barely changes the output (mean image difference 0 ...): learning rate too low?"
    snap = fold_events([{"event": "warning", "step": 3, "cause": "no_effect", "message": message},
                        {"event": "warning", "step": 4, "cause": "no_effect", "message": message},
                        {"event": "adapter_effect", "step": 4, "adapter_effect": 0.0, "adapter_norm": 3e-10}])
    box = rm.warnings_html(snap)
    assert box.count("run-warning") == 1 and "barely changes the output" in box
    assert "Adapter effect:** mean image difference 0 with vs without" in rm.artifacts_markdown(tmp_path, snap)
