"""The family conformance suite: every registered family (trainer_backend/families/registry.py)
gets these tests for free from its tiny random model.

- end to end: events, run files, a LoRA file with the family's metadata that loads in diffusers
  (`load_lora_weights`) and changes the generated image; through a real `accelerate launch` for one
  UNet and one transformer family (the launch path knows no family), in the test's process for the rest;
- the LoRA layout of the FULL-SIZE architecture (built on the meta device, no weights) converts
  back through diffusers' own loader onto exactly the modules that were trained: 100% of keys;
- gradient accumulation equals a bigger batch;
- resume from a checkpoint is bitwise exact;
- a full fine-tune's diffusers folder and single file load and hold the trained weights.
"""
from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import ROOT, make_dataset
from video_clips import make_clip_dataset
from method_runs import train_run
from trainer_backend.families import get_family, load_model
from trainer_backend.families.registry import BUILTIN_TINY, FAMILY_NAMES, entry
from trainer_backend.diffusion.adapter_effect import EFFECT_FLOOR

FAMILIES = list(FAMILY_NAMES)
# and the families' further tiny models (Flux.2 dev beside Klein: its own pipeline, text encoder and
# guidance), through the runs whose paths differ per model: the launch with samples, the full fine-tune
MODELS = FAMILIES + [name.removeprefix("tiny-") for name, (_, variant) in BUILTIN_TINY.items() if variant]


def _family(arch: str):
    return get_family(BUILTIN_TINY[f"tiny-{arch}"][0])


def _image(pipe, family=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    frames = {"num_frames": 5} if family is not None and family.frame_step else {}  # a video family: a clip
    out = pipe(prompt="a red square", num_inference_steps=2, height=64, width=64, generator=g, output_type="np",
               **frames, **_control_argument(family), **_first_frame(family), **_guidance(pipe, family))
    return torch.from_numpy(out.images[0] if hasattr(out, "images") else out.frames[0])


def _data(folder, family, n: int, size: int):
    """The training data: images, or for a video family (Family.frame_step) generated 9-frame clips (with an
    audio track each for a model with an audio stream: LTX-2 then trains both streams)."""
    if family.frame_step:
        return make_clip_dataset(folder, n=n, size=size, frames=9, audio=n if family.audio_stream else 0)
    return make_dataset(folder, n=n, size=size)


def _guidance(pipe, family) -> dict:
    """A pipeline whose default guidance is a per-step schedule for its own step count (Ideogram 4's
    48) takes a constant scale for these 2 steps, as the family's samples pass it."""
    if family is None or "guidance_schedule" not in inspect.signature(type(pipe).__call__).parameters:
        return {}
    return family.guidance_arguments(None, 3.0)


def _control_argument(family) -> dict:
    """An edit model's sample call takes its control image."""
    if family is None or not family.control_images:
        return {}
    from PIL import Image
    return {family.control_image_argument: Image.new("RGB", (64, 64), (200, 30, 30))}


def _first_frame(family) -> dict:
    """An image-to-video model's pipeline takes the clip's first frame (Wan 2.2 I2V)."""
    if family is None or not getattr(family, "first_frame_conditioned", False):
        return {}
    from PIL import Image
    return {"image": Image.new("RGB", (64, 64), (30, 120, 200))}


# families whose control images are optional and whose suite runs train on pairs all the same (their
# edit path: Krea 2's reference tokens), so accumulation, resume and the full fine-tune cover it
TRAINED_ON_PAIRS = ("krea2",)


def _control_data(tmp_path, family, n: int, size: int) -> list[str]:
    """An edit model trains on pairs: a control folder with an image per training image."""
    if family.control_images != "required" and family.name not in TRAINED_ON_PAIRS:
        return []
    return [f"dataset.control_path={make_dataset(tmp_path / 'control', n=n, size=size, seed=7)}"]


# Launched for real (three interpreters, ~16 CPU-s each on 2 cores, mostly imports): the launch path is the
# same for every family, so one UNet and one transformer family go through it and the others train in this
# process with the same settings (what differs per family is all in the trainer, which runs the same here)
LAUNCHED = ("sd1", "flux")


def _run_settings(arch: str, model_dir, folder) -> list[str]:
    """The end-to-end run's settings, as `--set` values."""
    family = _family(arch)
    data = _data(folder / "data", family, n=3, size=64)
    return [f"model.path={model_dir}", f"dataset.path={data}", "dataset.resolution=64",
            f"output.dir={folder / 'runs'}", f"output.name={arch}-lora", "schedule.max_steps=3", "network.rank=4",
            "network.alpha=4", "precision.mixed=no", "optimizer.lr=1e-2", "hardware.cpu=true",
            # the text encoders too, where the family's LoRA loaders take them (Z-Image's: the transformer only)
            f"network.train_text_encoder={str(entry(family.name).text_encoder_training).lower()}",
            *_control_data(folder, family, 3, 64)]


@pytest.fixture(scope="module")
def launched_runs(request, tmp_path_factory, tiny_models):
    """arch -> (run folder, the finished `accelerate launch` process) for the LAUNCHED families this
    session selected.

    Each run is a real, separate `accelerate launch`, as a user's is; they are started in the background,
    two at a time, when the first end-to-end test begins. Most of a launched run is single-threaded
    interpreter start-up and imports (three processes: launcher, accelerate, trainer), so two of them,
    plus the checks a test makes in-process on a finished run, share the 2 cores instead of queueing."""
    selected = [item.callspec.params["arch"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_lora_end_to_end"]
    pool = ThreadPoolExecutor(max_workers=2)
    runs = {}
    for arch in dict.fromkeys(a for a in selected if a in LAUNCHED):
        folder = tmp_path_factory.mktemp(f"e2e-{arch}")
        cmd = [sys.executable, "-m", "trainer_backend", "launch"]
        for setting in _run_settings(arch, tiny_models(arch), folder):  # the tiny model is built here, in order
            cmd += ["--set", setting]
        runs[arch] = (folder / "runs" / f"{arch}-lora", pool.submit(
            subprocess.run, cmd, cwd=ROOT, capture_output=True, text=True, timeout=900))
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("arch", MODELS)
def test_lora_end_to_end(arch, tiny_models, launched_runs, tmp_path):
    model_dir = tiny_models(arch)
    family = _family(arch)
    if arch in LAUNCHED:
        run, launched = launched_runs[arch]
        r = launched.result()
        assert r.returncode == 0, r.stderr[-3000:]
        # what the launcher and the trainer's own command line add around a run
        assert (run / "command.txt").is_file() and (run / "train.log").is_file()
    else:  # the same settings (they come after train_run's own, so they win), TensorBoard on as in a launch
        run, _, _ = train_run(tmp_path, model_dir, tmp_path / "data", f"{arch}-lora",
                              *_run_settings(arch, model_dir, tmp_path), "logging.tensorboard=true")
    out = run / f"{arch}-lora.safetensors"
    with safe_open(str(out), "pt") as f:
        keys, meta = list(f.keys()), f.metadata()
    assert keys, "the LoRA file is empty"
    assert meta["ss_network_dim"] == "4" and meta["ss_steps"] == "3"
    assert meta["modelspec.architecture"].startswith(family.modelspec_architecture)
    # the loaded variant's name (SD3.5 Medium, Flux.1 dev, ...) with the modelspec convention's adapter suffix
    base = load_model(str(model_dir))
    assert meta["ss_base_model_version"] == family.base_model_version_of(base)
    assert meta["ss_network_module"] == family.network_module and meta["modelspec.sai_model_spec"] == "1.0.1"
    assert meta["modelspec.architecture"] == f"{family.architecture(base)}/lora"
    freq = json.loads(meta["ss_tag_frequency"])  # per subset folder: tag -> count, as kohya writes it
    assert sum(freq["data"].values()) == 3 and "a red square on a plain background" in freq["data"]

    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "plan" and kinds[-1] == "done" and kinds.count("step") == 3
    # the end's adapter-effect check (diffusion/adapter_effect.py) saw this LoRA change the output: no warning
    # (edit models without sample prompts have no control image to draw with: no check)
    assert "warning" not in kinds
    if family.control_images != "required":
        (effect,) = [e for e in events if e["event"] == "adapter_effect"]
        assert effect["adapter_effect"] > EFFECT_FLOOR and effect["adapter_norm"] > 0
    assert all("time" in e for e in events)
    assert (run / "config.toml").is_file()
    assert any((run / "tb").iterdir())

    pipe = family.build_pipeline(base)  # plain diffusers pipeline over the base
    before = _image(pipe, family)
    pipe.load_lora_weights(str(out))
    assert (_image(pipe, family) - before).abs().max() > 1e-3, "the LoRA did not change the output"
    # the text-encoder adapters loaded too (the encoders the family trains; T5 stays frozen)
    for name in family.trainable_text_encoders():
        assert any("lora" in n for n, _ in getattr(pipe, name).named_parameters()), name


@pytest.mark.parametrize("arch", FAMILIES)
def test_full_size_lora_keys_all_load_in_diffusers(arch):
    """Adapters on the full-size denoiser (meta device, rank 1) written in the family's LoRA layout
    and read back by diffusers' own converter land on every adapted module, none missing or extra."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    family = get_family(arch)
    denoiser = family.meta_denoiser()
    denoiser.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=list(family.default_targets)))
    adapted = {name for name, m in denoiser.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    assert len(adapted) >= 50, "the full-size model should have many adapted modules"  # Klein 4B: 60
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}
    written = family.lora_file_state(_MetaModel(family, denoiser), {family.denoiser_name: state}, 1.0)
    loaded = family.diffusers_lora_targets(written, denoiser)
    assert loaded == adapted, (sorted(adapted - loaded)[:5], sorted(loaded - adapted)[:5])


def _offline_components(family, folder) -> dict:
    """Qwen-Image-Edit's (and -2509/2511's, Qwen-Image 2.1's) processor: transformers 5 cannot build it without torchvision (not installed
    here), so it is handed over already loaded (the family's loader does the same)."""
    if family.name == "qwen_image21":  # Qwen3-VL's processor, likewise
        from trainer_backend.families.qwen_image21.text import load_processor as load_qwen3_processor
        return {"processor": load_qwen3_processor(folder / "processor")}
    if not getattr(family, "edit", False):
        return {}
    from trainer_backend.families.qwen_image.text import load_processor
    return {"processor": load_processor(folder / "processor")}


class _MetaModel:
    """The parts of a LoadedModel the LoRA writer reads."""

    def __init__(self, family, denoiser):
        self.family, self.denoiser = family, denoiser


@pytest.mark.parametrize("arch", FAMILIES)
def test_gradient_accumulation_equals_bigger_batch(tmp_path, tiny_models, arch):
    """batch 4 × accum 1 vs batch 1 × accum 4 from the same seed: per-sample noise and timesteps
    are seeded by (seed, epoch, sample index), so both see identical noise; adapter dropout is 0.
    SGD, because Adam turns float summation-order noise on tiny gradients into full-size updates."""
    data = _data(tmp_path / "data", get_family(arch), n=4, size=32)
    common = ["schedule.epochs=2", "optimizer.name=sgd", "optimizer.lr=0.5", "network.dropout=0"]
    common += _control_data(tmp_path, get_family(arch), 4, 32)
    run_a, _, _ = train_run(tmp_path, tiny_models(arch), data, "b4a1", "schedule.batch_size=4", *common)
    run_b, _, _ = train_run(tmp_path, tiny_models(arch), data, "b1a4", "schedule.batch_size=1",
                            "schedule.grad_accum=4", *common)
    a, b = load_file(str(run_a / "b4a1.safetensors")), load_file(str(run_b / "b1a4.safetensors"))
    assert a.keys() == b.keys()
    worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item()
                for k in a if not k.endswith(".alpha"))
    assert worst <= 1e-5, f"max relative difference {worst:.2e}"
    # lora_up / lora_B start at zero: a non-zero one means training moved the weights
    assert any(a[k].abs().max() > 0 for k in a if "lora_up" in k or "lora_B" in k), "training did not move"


@pytest.mark.parametrize("arch", FAMILIES)
def test_resume_from_a_checkpoint_is_bitwise_exact(tmp_path, tiny_models, arch):
    """4 steps straight (checkpoint every 2), then a new run that starts from a copy of the step-2
    checkpoint: it trains steps 3 and 4 and writes the very same LoRA tensors."""
    data = _data(tmp_path / "data", get_family(arch), n=4, size=32)
    common = ["schedule.max_steps=4", "checkpoints.every_n_steps=2", "optimizer.lr=1e-3", "schedule.seed=3"]
    common += _control_data(tmp_path, get_family(arch), 4, 32)
    straight, _, _ = train_run(tmp_path, tiny_models(arch), data, "straight", *common)
    checkpoint = straight / "checkpoints" / "step-00000002"
    shutil.copytree(checkpoint, tmp_path / "runs" / "resumed" / "checkpoints" / checkpoint.name)
    resumed, events, _ = train_run(tmp_path, tiny_models(arch), data, "resumed", *common)
    assert [e["step"] for e in events if e["event"] == "step"] == [3, 4]
    a, b = load_file(str(straight / "straight.safetensors")), load_file(str(resumed / "resumed.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]


@pytest.mark.parametrize("arch", MODELS)
def test_full_finetune_outputs_load_and_hold_the_trained_weights(tmp_path, tiny_models, arch):
    """bf16 mixed precision with frozen text encoders: the folder and the single file both load,
    hold the same trained denoiser, and the frozen parts keep the base weights (not bf16 copies)."""
    family = _family(arch)
    model_dir = tiny_models(arch)
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, events, _ = train_run(tmp_path, model_dir, data, "ft", "network.type=full", "schedule.max_steps=2",
                               "optimizer.lr=1e-3", "precision.mixed=bf16", "network.save_precision=fp32",
                               *_control_data(tmp_path, family, 2, 32))
    folder, single = run / "ft-diffusers", run / "ft.safetensors"
    written = [str(single), str(folder)] if family.full_single_file else [str(folder)]
    assert [e["outputs"] for e in events if e["event"] == "done"] == [written]
    base = load_model(str(model_dir))
    pipe = family.model_pipeline_class(base).from_pretrained(str(folder), local_files_only=True,  # plain diffusers
                                                             **_offline_components(family, folder))

    def diff(a, b) -> float:
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        return max((sa[k].float() - sb[k].float()).abs().max().item() for k in sa)

    trained = getattr(pipe, family.denoiser_name)
    assert diff(trained, base.denoiser) > 1e-5, "the denoiser did not change"
    assert diff(pipe.vae, base.vae) == 0.0
    for name, original in zip(family.text_encoder_names, base.text_encoders):
        assert diff(getattr(pipe, name), original) == 0.0, name
    if family.full_single_file:  # stamped with the base model's architecture, no adapter suffix
        with safe_open(str(single), "pt") as f:
            assert f.metadata()["modelspec.architecture"] == family.architecture(base)
    if family.full_single_file == "whole":  # one file with everything (SD checkpoints)
        from_file = load_model(str(single))
        assert from_file.family is family
        assert diff(trained, from_file.denoiser) == 0.0
        for loaded, original in zip(from_file.text_encoders, base.text_encoders):
            assert diff(loaded, original) == 0.0
    elif family.full_single_file == "denoiser":  # the denoiser alone, in the original layout (Flux)
        assert diff(trained, family.load_denoiser_file(single, like=base.denoiser)) == 0.0
