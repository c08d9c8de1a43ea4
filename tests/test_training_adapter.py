"""network.training_adapter (methods/training_adapter.py): a frozen LoRA on the base during training steps
only. On tiny Z-Image: a step's prediction is the base with the adapter file loaded by diffusers plus the
trained adapter; sample rounds are exactly the base plus the trained adapter; the saved LoRA has the keys
of a run without it and resume is bitwise; a file that does not fit is refused naming the key."""
from __future__ import annotations

import shutil

import json

import numpy as np
import pytest
import torch
from PIL import Image
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

from conftest import make_dataset
from method_runs import last_checkpoint, train_run
from trainer_backend.__main__ import main as cli
from trainer_backend.config import ConfigError, load_config
from trainer_backend.diffusion.sampling import TRAINING_ADAPTER, training_adapter_off
from trainer_backend.families import load_model

ARCH = "zimage"


def _adapter_file(tiny_models, path, arch=ARCH, rank=2, alpha=1.0, seed=5, layout="diffusers"):
    """A LoRA file written by the family's own writer (diffusers layout) on a tiny model, non-zero B, on
    the family's default targets (more modules than the trained adapter's q/k/v/out)."""
    model = load_model(str(tiny_models(arch)))
    model.denoiser.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(model.family.default_targets)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.denoiser.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model.denoiser).items()}
    written = model.family.lora_file_state(model, {model.family.denoiser_name: state}, lambda *_: alpha, layout)
    save_file({k: v.contiguous() for k, v in written.items()}, str(path))
    return path


def _config(*overrides):
    return load_config(None, ["network.rank=4", "network.alpha=4", *overrides])


def _trained(model, *overrides, seed=7):
    """setup_method as a run does, with the trained adapter moved off zero (as after some steps)."""
    from trainer_backend.methods import setup_method
    trainable = setup_method(model, _config(*overrides))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainable.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return trainable


def _prediction(model) -> torch.Tensor:
    family, g = model.family, torch.Generator().manual_seed(1)
    f = model.vae_scale_factor
    latents = torch.randn(1, *family.latent_shape(model, 8 * f, 8 * f), generator=g)
    with torch.no_grad():
        text = family.encode_text(model, family.tokenize(model, ["a red square"], 32))
        return family.predict(model, model.denoiser, latents, torch.tensor([500.0]), text, {}, torch.float32)


@pytest.fixture(scope="module")
def adapter(tiny_models, tmp_path_factory):
    return _adapter_file(tiny_models, tmp_path_factory.mktemp("adapter") / "dedistill.safetensors")


@pytest.mark.parametrize("arch", [ARCH, "krea2-turbo"])
def test_steps_see_the_adapter_as_diffusers_loads_it_and_samples_do_not(tiny_models, tmp_path, arch):
    adapter = _adapter_file(tiny_models, tmp_path / "dedistill.safetensors", arch)
    model = load_model(str(tiny_models(arch)))
    trainable = _trained(model, f"network.training_adapter={adapter}")
    # frozen, outside the trainable state the checkpoints and the optimizer see
    assert not any(TRAINING_ADAPTER in name for name in trainable.named_parameters())
    assert all(not p.requires_grad for n, p in model.denoiser.named_parameters() if TRAINING_ADAPTER in n)
    assert not any(TRAINING_ADAPTER in k for k in trainable.state_dict("transformer"))
    with_adapter = _prediction(model)

    # the reference: diffusers' loader puts the file on a fresh base, then the same trained adapter beside it
    reference = load_model(str(tiny_models(arch)))
    reference.denoiser.load_lora_adapter(load_file(str(adapter)), prefix="transformer", adapter_name="file")
    plain = load_model(str(tiny_models(arch)))
    plain_trainable = _trained(plain)  # the same seed: the same trained weights
    reference.denoiser.add_adapter(plain.denoiser.peft_config["default"])
    reference.denoiser.set_adapters(["file", "default"])
    from peft.utils import set_peft_model_state_dict
    set_peft_model_state_dict(reference.denoiser, plain_trainable.state_dict("transformer"))
    torch.testing.assert_close(with_adapter, _prediction(reference), rtol=1e-5, atol=1e-6)
    assert (with_adapter - _prediction(plain)).abs().max() > 1e-3  # the adapter changes the step's prediction

    flags = {n: p.requires_grad for n, p in model.denoiser.named_parameters()}
    with training_adapter_off([model.denoiser]):  # a sample round: the base + the trained adapter, exactly
        assert torch.equal(_prediction(model), _prediction(plain))
    assert flags == {n: p.requires_grad for n, p in model.denoiser.named_parameters()}
    assert torch.equal(_prediction(model), with_adapter)  # back on after the round: no drift


@pytest.mark.parametrize("layout", ["kohya", "original"])
def test_any_layout_the_family_reads_gives_the_same_steps(tiny_models, adapter, tmp_path, layout):
    """Z-Image's musubi/kohya layout and the original checkpoint's (fused qkv) layout: the same adapter."""
    other = _adapter_file(tiny_models, tmp_path / f"{layout}.safetensors", layout=layout)
    assert set(load_file(str(other))) != set(load_file(str(adapter)))
    model, reference = load_model(str(tiny_models(ARCH))), load_model(str(tiny_models(ARCH)))
    _trained(model, f"network.training_adapter={other}")
    _trained(reference, f"network.training_adapter={adapter}")
    torch.testing.assert_close(_prediction(model), _prediction(reference), rtol=1e-5, atol=1e-6)


def test_a_file_that_does_not_fit_is_refused_naming_the_key(tiny_models, adapter, tmp_path):
    state = load_file(str(adapter))
    key = next(k for k in state if k.endswith("lora_A.weight"))
    wrong = dict(state)
    wrong[key] = torch.zeros(state[key].shape[0], state[key].shape[1] + 3)
    save_file(wrong, str(tmp_path / "wrong.safetensors"))
    model = load_model(str(tiny_models(ARCH)))
    with pytest.raises(ConfigError, match=rf"network\.training_adapter: .*{key.split('.', 1)[1]}.* has shape"):
        _trained(model, f"network.training_adapter={tmp_path / 'wrong.safetensors'}")
    missing = {k.replace("layers.0.", "layers.77."): v for k, v in state.items()}
    save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(ConfigError, match=r"network\.training_adapter: .*layers\.77\."):
        _trained(load_model(str(tiny_models(ARCH))), f"network.training_adapter={tmp_path / 'missing.safetensors'}")
    with pytest.raises(ConfigError, match=r"network\.training_adapter: .*network\.type = lora"):
        from trainer_backend.config import rules
        rules.check(_config("network.type=full", f"network.training_adapter={adapter}"))
    from trainer_backend.config.checks import run_problems
    (tmp_path / "page.safetensors").write_text("<html>not found</html>")
    for name, why in (("nothing.safetensors", "no such file"), ("page.safetensors", "")):
        found = [p for p in run_problems(_config(f"network.training_adapter={tmp_path / name}"))
                 if p.key == "network.training_adapter"]
        assert len(found) == 1 and str(tmp_path / name) in found[0].message and why in found[0].message
    with pytest.raises(ConfigError, match=r"network\.training_adapter: not with network\.dora"):
        rules.check(_config("network.dora=true", f"network.training_adapter={adapter}"))


def _sample_matches_the_tool(run) -> float:
    """The largest pixel difference between the run's step-2 sample and what 'sample this LoRA at strengths'
    draws from the base + the step-2 checkpoint (no training adapter: it loads the saved LoRA alone)."""
    (trained,) = [e for e in _events(run) if e["event"] == "sample" and e.get("strength") is None and e["step"] == 2]
    assert cli(["lora", "sample", "--run", str(run), "--checkpoint", str(last_checkpoint(run)),
                "--strengths", "1"]) == 0
    (ours,) = [e for e in _events(run) if e["event"] == "sample" and e.get("source") == "step-00000002"]
    a = np.asarray(Image.open(run / ours["paths"][0]), dtype=float)
    b = np.asarray(Image.open(run / trained["paths"][0]), dtype=float)
    return float(np.abs(a - b).max())


def _events(run):
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_runs_save_the_same_keys_sample_without_it_and_resume_bitwise(tiny_models, adapter, tmp_path, monkeypatch):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    common = ["schedule.max_steps=2", "checkpoints.every_n_steps=1", "optimizer.lr=1e-2", "schedule.seed=3",
              "samples.every_n_steps=2", 'samples.prompts="a red square --w 32 --h 32 --s 2"']
    plain, _, _ = train_run(tmp_path, tiny_models(ARCH), data, "plain", *common)
    straight, events, _ = train_run(tmp_path, tiny_models(ARCH), data, "straight", *common,
                                    f"network.training_adapter={adapter}")
    a, b = load_file(str(plain / "plain.safetensors")), load_file(str(straight / "straight.safetensors"))
    assert a.keys() == b.keys()
    assert not all(torch.equal(a[k], b[k]) for k in a)  # the adapter changed what was learned
    said = f"training adapter: {adapter} (applied to training steps, off for samples)"
    assert said in _log(straight)
    assert [e["warnings"] for e in events if e["event"] == "plan"] == [[said]]
    checkpoint = straight / "checkpoints" / "step-00000001"
    assert not any(TRAINING_ADAPTER in k for f in checkpoint.glob("*.safetensors") for k in load_file(str(f)))
    # the step-2 sample is the distilled base + the trained LoRA, as the user will use it
    assert _sample_matches_the_tool(straight) <= 2

    shutil.copytree(checkpoint, tmp_path / "runs" / "resumed" / "checkpoints" / checkpoint.name)
    resumed, events, _ = train_run(tmp_path, tiny_models(ARCH), data, "resumed", *common,
                                   f"network.training_adapter={adapter}")
    assert [e["step"] for e in events if e["event"] == "step"] == [2]
    c = load_file(str(resumed / "resumed.safetensors"))
    assert all(torch.equal(b[k], c[k]) for k in b), [k for k in b if not torch.equal(b[k], c[k])][:3]

    # without the switch, the sample round would show the adapter: the comparison above can fail
    import contextlib
    import trainer_backend.diffusion.sampling as sampling
    monkeypatch.setattr(sampling, "training_adapter_off", lambda modules: contextlib.nullcontext())
    unswitched, _, _ = train_run(tmp_path, tiny_models(ARCH), data, "unswitched", *common,
                                 f"network.training_adapter={adapter}")
    assert _sample_matches_the_tool(unswitched) > 2


def _log(run) -> str:
    return "\n".join(p.read_text() for p in run.glob("*.log"))


@pytest.mark.parametrize("kind", ["int8", "int8_compute"])
def test_on_a_quantized_base_steps_have_it_and_samples_are_exactly_without(tiny_models, adapter, kind):
    """model.quantize (the frozen base stored 8-bit before the adapters, as training/setup.py place_denoiser
    does, or computed 8-bit after them, methods/lora.py): the adapter sits beside the trained one on the
    quantized layers; switched off it adds nothing (bitwise the quantized base + trained adapter)."""
    from trainer_backend.compute.quantize import quantize_module, quantized_kind
    from trainer_backend.methods import setup_method

    def quantized(*overrides):
        model = load_model(str(tiny_models(ARCH)))
        if kind == "int8":
            quantize_module(model.denoiser, kind, device=torch.device("cpu"), compute_dtype=torch.float32,
                            keep=getattr(model.family, "keep_unquantized", ()))
        trainable = setup_method(model, _config("model.quantize=" + kind, *overrides))
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in trainable.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        return model

    model, plain = quantized(f"network.training_adapter={adapter}"), quantized()
    assert quantized_kind(model.denoiser) == kind
    layers = [m for m in model.denoiser.modules() if hasattr(m, "lora_A") and TRAINING_ADAPTER in m.lora_A]
    bases = [m.get_base_layer() for m in layers]  # 8-bit: torchao's weights, or our LowBitLinear
    assert bases and all(type(b) is not torch.nn.Linear or type(b.weight.data) is not torch.Tensor for b in bases)
    with_adapter = _prediction(model)
    assert (with_adapter - _prediction(plain)).abs().max() > 1e-3
    with training_adapter_off([model.denoiser]):
        assert torch.equal(_prediction(model), _prediction(plain))
    assert torch.equal(_prediction(model), with_adapter)


def test_block_swap_trains_the_same_lora_with_the_adapter(tiny_models, adapter, tmp_path):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    common = ["schedule.max_steps=1", "optimizer.lr=1e-3", f"network.training_adapter={adapter}",
              "samples.every_n_steps=1", 'samples.prompts="a red square --w 32 --h 32 --s 2"']
    plain, _, _ = train_run(tmp_path, tiny_models(ARCH), data, "plain", *common)
    swapped, events, _ = train_run(tmp_path, tiny_models(ARCH), data, "swapped", "memory.block_swap=1",
                                   "precision.gradient_checkpointing=true", *common)
    a, b = load_file(str(plain / "plain.safetensors")), load_file(str(swapped / "swapped.safetensors"))
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    (p, s) = (np.asarray(Image.open(next((r / "samples").glob("*.png"))), dtype=float) for r in (plain, swapped))
    assert np.abs(p - s).max() <= 1  # and samples as the plain run does (its blocks moved around the round)
