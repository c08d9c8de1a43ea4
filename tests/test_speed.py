"""speed.*: regional torch.compile (inductor on the CPU) and a step that does not wait on the host.

The compiled run must train what the eager run trains (same losses within float tolerance), compile each
block kind once per input shape (a second bucket is one recompilation, not one per step), resume bitwise,
and report its compile phase; the step path must read no device value between log steps (counted by the
trainer's own HostReads on every tensor method, so a new `.item()` in the loop or a family fails here).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import last_checkpoint, train_run
from trainer_backend.training.host_sync import HostReads, StepLosses

STEPS = ("schedule.max_steps=4", "schedule.epochs=100", "logging.log_every=1")


def two_bucket_dataset(folder):
    """Two square and two 2:1 images: with bucketing at 32 px, two latent shapes."""
    make_dataset(folder, n=2, size=32)
    for i, color in enumerate(((200, 40, 40), (40, 200, 40))):
        Image.new("RGB", (64, 32), color).save(folder / f"wide{i}.png")
        (folder / f"wide{i}.txt").write_text("a wide picture")
    return folder


def losses(events):
    return [e["loss"] for e in events if e["event"] == "step"]


@pytest.mark.parametrize("arch", ["sd1", "flux"])
def test_no_host_reads_inside_the_steps(arch, tiny_models, tmp_path, fresh_accelerate_state):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    cache = () if arch == "sd1" else ("dataset.cache_text_encoder_outputs=true",)  # T5 masks read per step
    _, counted, _ = train_run(tmp_path, tiny_models(arch), data, "counted", *STEPS, "speed.count_host_reads=true",
                              "speed.host_read_every=2", *cache)
    steps = [e for e in counted if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]  # every step's event, written at the reads
    assert [e["host_reads"] for e in steps] == [0, 0, 0, 0]
    _, plain, _ = train_run(tmp_path, tiny_models(arch), data, "plain", *STEPS, *cache)
    assert losses(plain) == losses(counted)  # reading late changes nothing that is trained


def test_the_read_counter_sees_a_device_read_and_not_host_data():
    loss, host = torch.ones(3).sum(), torch.tensor([1, 2])
    with HostReads({id(host): host}) as reads:
        loss.item()
        host.tolist()
        (host + 1).tolist()  # computed from host data alone: still host data
        bool(torch.ones(2)[torch.tensor([True, False])].sum() > 0)  # a boolean index and a bool()
    assert reads.count == 3 and any("test_speed.py" in place for place in reads.where)


def test_pending_losses_are_read_in_one_go_oldest_first():
    pending = StepLosses(every=3)
    for step in (1, 2):
        pending.add(step, torch.tensor([float(step)]))
        assert not pending.due(step, total=10)
    pending.add(3, torch.tensor(float("nan")))
    assert pending.due(3, total=10) and pending.due(5, total=5)
    read = pending.read()
    assert read[:2] == [(1, 1.0), (2, 2.0)] and read[2][0] == 3 and read[2][1] != read[2][1]
    assert pending.read() == []


def test_compiled_blocks_train_as_eager(tiny_models, tmp_path, fresh_accelerate_state):
    """One image size: the first step is the compile phase, later steps reuse the graphs (inductor, CPU)."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    common = ("schedule.max_steps=3", "schedule.epochs=100")
    _, eager, _ = train_run(tmp_path, tiny_models("sd1"), data, "eager", *common)
    run, compiled, _ = train_run(tmp_path, tiny_models("sd1"), data, "compiled", *common, "speed.compile=blocks")
    assert losses(compiled) == pytest.approx(losses(eager), rel=1e-4, abs=1e-5)
    assert [(p["step"], p["status"]) for p in compiled if p["event"] == "compile"] == [(1, "started"), (1, "done")]
    assert "compiled" in (run / "train.log").read_text()
    cache = Path(os.environ["SD_STUDIO_CACHE"]) / "inductor"  # compiled kernels kept for the next run, outside it
    assert cache.is_dir() and any(cache.iterdir())
    assert not any("inductor" in p.name or "torchinductor" in p.name for p in run.rglob("*"))


@pytest.mark.slow  # ~10 min on a busy 2-core machine (two shapes, forward and backward, then a resume)
def test_compiled_blocks_compile_once_per_shape_and_resume_bitwise(tiny_models, tmp_path, fresh_accelerate_state):
    data = two_bucket_dataset(tmp_path / "data")
    common = ("schedule.max_steps=6", "schedule.epochs=100", "dataset.bucketing=true", "dataset.bucket_step=8",
              "dataset.bucket_min_side=16", "checkpoints.every_n_steps=3")
    model = tiny_models("sd1")
    eager_run, eager, _ = train_run(tmp_path, model, data, "eager", *common)
    run, compiled, _ = train_run(tmp_path, model, data, "compiled", *common, "speed.compile=blocks")
    assert losses(compiled) == pytest.approx(losses(eager), rel=1e-4, abs=1e-5)
    phases = [e for e in compiled if e["event"] == "compile"]
    assert [p["status"] for p in phases[:2]] == ["started", "done"] and phases[1]["graphs"] > 0
    # two buckets (square, 2:1) in every epoch: the second shape compiles once, then both are reused
    assert sum(p["status"] == "recompiled" for p in phases) == 1
    assert "compiled" in (run / "train.log").read_text()
    # resume from step 3 with compile on: bitwise the uninterrupted compiled run
    resumed_dir = tmp_path / "runs" / "resumed"
    (resumed_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step-00000003", resumed_dir / "checkpoints" / "step-00000003")
    train_run(tmp_path, model, data, "resumed", *common, "speed.compile=blocks")
    a, b = load_file(run / "compiled.safetensors"), load_file(resumed_dir / "resumed.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert last_checkpoint(eager_run).name == "step-00000006"


@pytest.mark.slow
def test_compiled_flux_trains_as_eager(tiny_models, tmp_path, fresh_accelerate_state):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    common = ("schedule.max_steps=3", "schedule.epochs=100")
    _, eager, _ = train_run(tmp_path, tiny_models("flux"), data, "eager", *common)
    _, compiled, _ = train_run(tmp_path, tiny_models("flux"), data, "compiled", *common, "speed.compile=blocks")
    assert losses(compiled) == pytest.approx(losses(eager), rel=1e-4, abs=1e-5)


def test_compile_is_refused_with_block_swap(tmp_path):
    from trainer_backend.config import load_config, rules
    cfg = load_config(None, ["speed.compile=blocks", "memory.block_swap=2", f"output.dir={tmp_path}"])
    problems = [str(p) for p in rules.problems(cfg)]
    assert any(p.startswith("speed.compile:") and "memory.block_swap" in p for p in problems)


# ----------------------------------------------------------------------------- dataset.cache_auto

def _cfg(*overrides):
    from trainer_backend.config import load_config
    return load_config(None, list(overrides))


@pytest.mark.parametrize("overrides, latents, text, why", [
    ((), True, True, ""),
    (("dataset.center_crop=false",), False, True, "random crop"),
    (("dataset.flip=true",), True, True, ""),  # both flips are cached
    (("dataset.flip=true", "dataset.cache_both_flips=false"), False, True, "dataset.flip"),
    (("dataset.caption_dropout=0.1",), True, False, "caption_dropout"),
    (("dataset.shuffle_tags=true",), True, False, "shuffle_tags"),
    (("network.train_text_encoder=true",), True, False, "train_text_encoder"),
    (("dataset.subsets=[{path='x', center_crop=false, tag_dropout=0.2}]",), False, False, "tag_dropout"),
    (("dataset.cache_auto=false",), False, False, "cache_auto is off"),
    (("dataset.cache_auto=false", "dataset.cache_latents=true"), True, False, "cache_auto is off"),
])
def test_auto_caching_caches_what_no_step_changes_and_says_why(overrides, latents, text, why):
    from trainer_backend.config.caching import auto_caching, with_auto_caching
    cfg = _cfg(*overrides)
    choice = auto_caching(cfg)
    assert (choice.latents, choice.text) == (latents, text)
    assert why in choice.summary()
    resolved = with_auto_caching(cfg)
    assert (resolved.dataset.cache_latents, resolved.dataset.cache_text_encoder_outputs) == (latents, text)
    assert cfg.dataset.cache_latents == ("dataset.cache_latents=true" in overrides)  # the input is left alone


@pytest.mark.parametrize("arch", ["sd1", "qwen_image_edit"])
def test_the_default_run_caches_and_trains_as_the_explicit_caches(arch, tiny_models, tmp_path, fresh_accelerate_state):
    """cache_auto on (the default) trains exactly what asking for both caches trains; an edit family whose text
    encoder reads the control image keeps encoding its captions, without a warning."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    extra = ()
    if arch == "qwen_image_edit":
        make_dataset(tmp_path / "control", n=2, size=32, seed=3)
        extra = (f"dataset.control_path={tmp_path / 'control'}",)
    run, auto, _ = train_run(tmp_path, tiny_models(arch), data, "auto", *STEPS, "dataset.cache_auto=true", *extra)
    _, explicit, _ = train_run(tmp_path, tiny_models(arch), data, "explicit", *STEPS, "dataset.cache_latents=true",
                               "dataset.cache_text_encoder_outputs=true", *extra)
    assert losses(auto) == losses(explicit)
    log = (run / "train.log").read_text()
    assert "caching: latents cached" in log and "WARNING" not in log.split("caching:")[1].split("\n")[0]
    saved = (run / "config.toml").read_text()
    assert "cache_latents = true" in saved  # the run's config records what was cached


@pytest.mark.parametrize("overrides, refused", [
    (("dataset.cache_latents=true", "hardware.cpu=true"), "need a CUDA device"),
    (("dataset.cache_latents=true", "dataset.bucketing=true"), "dataset.bucketing"),
    (("dataset.cache_auto=false",), "latents are encoded every step"),
    (("dataset.center_crop=false",), "random crop"),
    (("dataset.cache_latents=true",), ""),
    ((), ""),  # cache_auto caches the latents
])
def test_cuda_graphs_are_refused_unless_shapes_are_static(overrides, refused, tmp_path):
    from trainer_backend.config import load_config, rules
    cfg = load_config(None, ["speed.compile=blocks", "speed.compile_mode=reduce-overhead", f"output.dir={tmp_path}",
                             *overrides])
    lines = [str(p) for p in rules.problems(cfg) if p.key == "speed.compile_mode"]
    assert [refused in line for line in lines] == ([True] if refused else [])
    assert all("\n" not in line for line in lines)


def test_cuda_graphs_on_a_run_without_cuda_stop_with_one_line(tiny_models, tmp_path, fresh_accelerate_state):
    """hardware.cpu off, but no CUDA device found: the trainer refuses before the first step, naming the key."""
    from trainer_backend.config import ConfigError, load_config
    from trainer_backend.training.loop import train
    data = make_dataset(tmp_path / "data", n=2, size=32)
    cfg = load_config(None, [f"model.path={tiny_models('sd1')}", f"dataset.path={data}", "dataset.resolution=32",
                             f"output.dir={tmp_path / 'runs'}", "output.name=graphs", "precision.mixed=no",
                             "schedule.max_steps=1", "speed.compile=blocks", "speed.compile_mode=reduce-overhead",
                             "dataset.cache_latents=true", "logging.tensorboard=false"])
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the refusal is for runs without one")
    with pytest.raises(ConfigError, match=r"^speed.compile_mode: reduce-overhead records CUDA graphs and this "
                                          r"run's device is cpu"):
        train(cfg)
    events = (cfg.run_dir / "events.jsonl").read_text()
    assert '"event": "step"' not in events
