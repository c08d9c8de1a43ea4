"""Two real CPU ranks (gloo) through `accelerate launch`: DDP equals one process with the
combined batch, the run follows the plan exactly, and outputs are written once."""
import json

import pytest
import subprocess
import sys

from safetensors.torch import load_file

from conftest import ROOT, make_dataset
from trainer_backend.config import load_config
from trainer_backend.training.loop import train
from trainer_backend.config.checks import validate_for_run


@pytest.mark.both_cores
def test_two_processes_match_one_process_with_double_batch(tmp_path, tiny_models):
    """2 processes × batch 1 vs 1 process × batch 2, same seed and data order. SGD (see the
    accumulation test for why not Adam), no adapter dropout; per-sample noise is seeded by the
    sample index, so each sample gets the same noise on either rank layout. The text-encoder
    LoRA is trained too, so its gradients must be synchronised as well."""
    model_dir = tiny_models("sd1")
    data = make_dataset(tmp_path / "data", n=4, size=32)
    common = [f"model.path={model_dir}", f"dataset.path={data}", "dataset.resolution=32",
              f"output.dir={tmp_path / 'runs'}", "precision.mixed=no", "network.rank=4", "network.alpha=4",
              "network.dropout=0", "network.train_text_encoder=true", "optimizer.name=sgd", "optimizer.lr=0.5",
              "schedule.epochs=2", "hardware.cpu=true", "logging.tensorboard=false",
              "optimizer.scheduler=linear", "optimizer.warmup_steps=2"]

    # the 2-process plan turns warmup 2 into 1 (same_samples); give the 1-process run the same
    one = validate_for_run(load_config(None, [*common, "output.name=one", "schedule.batch_size=2",
                                              "optimizer.warmup_steps=1"]))
    assert train(one) == 0

    cmd = [sys.executable, "-m", "trainer_backend", "launch"]
    for item in [*common, "output.name=two", "schedule.batch_size=1", "hardware.num_processes=2"]:
        cmd += ["--set", item]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]

    run = tmp_path / "runs" / "two"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    plans = [e for e in events if e["event"] == "plan"]
    assert len(plans) == 1 and plans[0]["num_processes"] == 2
    total = plans[0]["multi"]["total_steps"]
    assert total == 4  # 4 samples / (1 × 2 ranks) = 2 steps per epoch, 2 epochs
    assert len([e for e in events if e["event"] == "step"]) == total
    assert [e["event"] for e in events].count("done") == 1
    # The LR schedule follows the plan's optimizer steps, not steps × processes: linear warmup
    # over the plan's warmup steps (same_samples divides a warmup given in steps by N: 2 -> 1),
    # then linear decay to 0 at the plan's last step. Each event holds the LR its step used.
    warmup = plans[0]["multi"]["warmup_steps"]
    assert warmup == 1
    expected = [0.5 * s / warmup if s < warmup else 0.5 * (total - s) / (total - warmup) for s in range(total)]
    lrs = [e["lr"] for e in events if e["event"] == "step"]
    assert lrs == pytest.approx(expected), lrs
    assert sorted(p.name for p in run.glob("*.safetensors")) == ["two.safetensors"]
    log = (run / "train.log").read_text()
    assert log.count(f"saved {run / 'two.safetensors'}") == 1, "the main process alone writes outputs and the log"

    a = load_file(str(tmp_path / "runs" / "one" / "one.safetensors"))
    b = load_file(str(run / "two.safetensors"))
    assert a.keys() == b.keys() and any(k.startswith("lora_te_") for k in a)
    worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item()
                for k in a if not k.endswith(".alpha"))
    assert worst <= 1e-5, f"max relative difference {worst:.2e}"
