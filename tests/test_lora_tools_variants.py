"""DoRA, LoHa and LoKr files (the peft layout the trainer writes, methods/variants.py) in the LoRA tools
(issue 33): inspect reads them; merge bakes them through peft's own layer math, and the merged model draws
what the base with the file loaded through peft draws; resize turns one into a LoRA; mix refuses it."""
from __future__ import annotations

import pytest
import torch

from test_lora_tools import image, run_cli
from trainer_backend.__main__ import main as cli
from trainer_backend.config import load_config
from trainer_backend.families import load_model
from trainer_backend.families.registry import get_family
from trainer_backend.lora_tools.updates import open_updates

VARIANTS = {"dora": ["network.dora=true"], "loha": ["network.type=loha"],
            "lokr": ["network.type=lokr", "network.lokr_factor=4"]}


def make_variant_file(model_dir, path, variant, seed=0):
    """The trainer's own writer (save_adapter_output) over adapters with random weights: every factor (LoHa,
    LoKr) or lora_B and DoRA's magnitude moved, so the file changes the output."""
    from trainer_backend.methods import setup_method
    from trainer_backend.methods.variants import save_adapter_output
    model = load_model(str(model_dir))
    cfg = load_config(None, ["network.rank=4", "network.alpha=2", *VARIANTS[variant]])
    trainable = setup_method(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainable.modules[model.family.denoiser_name].named_parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * (0.05 if "magnitude" in name else 0.2))
    return save_adapter_output(cfg, path, model, trainable, model.family.lora_metadata())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_merge_bakes_a_variant_as_peft_loads_it(variant, tiny_models, tmp_path):
    from trainer_backend.methods.variants import load_adapter_file
    model_dir, family = tiny_models("sd1"), get_family("sd1")
    lora = make_variant_file(model_dir, tmp_path / f"{variant}.safetensors", variant)
    report = run_cli("inspect", str(lora), "--base", str(model_dir))
    name = {"dora": "DoRA", "loha": "LoHa", "lokr": "LoKr"}[variant]
    assert report["adapters"]["unet"]["variant"] == name and report["modules"] > 0
    assert report["base"]["fits"] is True and report["base"]["mapped_modules"] == report["modules"]

    merged = run_cli("merge", "--base", str(model_dir), "--lora", str(lora), "--out", str(tmp_path / "m"))
    assert merged["adapters"] == {str(lora): name}
    plain = image(family.build_pipeline(load_model(str(model_dir))), family)
    pipe = family.build_pipeline(load_model(str(model_dir)))
    load_adapter_file(pipe, lora)  # peft's own forward with the adapter on
    want = image(pipe, family)
    got = image(family.build_pipeline(load_model(str(tmp_path / "m"))), family)
    assert (want - plain).abs().max() > 1e-3, "the adapter does nothing: the comparison would prove nothing"
    assert (got - want).abs().max() < 1e-4


def test_a_variant_for_another_model_is_refused_in_one_line(tiny_models, tmp_path, capsys):
    lora = make_variant_file(tiny_models("sd1"), tmp_path / "dora.safetensors", "dora")
    assert cli(["lora", "merge", "--base", str(tiny_models("sdxl")), "--lora", str(lora),
                "--out", str(tmp_path / "m")]) == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "dora.safetensors" in err and "does not fit the base model" in err
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.safetensors").exists()


def test_resize_turns_a_loha_into_a_lora_and_mix_refuses_it(tiny_models, tmp_path, capsys):
    model_dir = tiny_models("sd1")
    lora = make_variant_file(model_dir, tmp_path / "loha.safetensors", "loha")
    model = load_model(str(model_dir))
    want = dict(open_updates(model, lora).at(1.0))
    out = tmp_path / "as-lora.safetensors"
    report = run_cli("resize", str(lora), "--base", str(model_dir), "--rank", "64", "--out", str(out))
    assert min(report["kept_energy"].values()) == pytest.approx(1.0, abs=1e-6)  # full rank: nothing lost
    got = open_updates(model, out)
    assert got.kind == "LoRA" and got.layers == len(want)
    assert max(float((d - want[k]).abs().max()) for k, d in got.at(1.0)) < 1e-5

    assert cli(["lora", "mix", f"{lora}:1", "--base", str(model_dir), "--out", str(tmp_path / "x.safetensors")]) == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "loha.safetensors: a LoHa file" in err and "mix takes LoRA/LoCon files only" in err
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.slow   # a training run (~8 s); the averaging itself is test_lora_tools.py's EMA test
def test_post_hoc_ema_of_a_lokr_run_averages_its_parameters_in_the_trainers_layout(tiny_models, tmp_path):
    from safetensors.torch import load_file
    from conftest import make_dataset
    from method_runs import train_run
    from trainer_backend.lora_tools import linalg
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, _, _ = train_run(tmp_path, tiny_models("sd1"), data, "lokr", "schedule.max_steps=2", "optimizer.lr=1e-2",
                          "checkpoints.every_n_steps=1", *VARIANTS["lokr"])
    out = tmp_path / "ema.safetensors"
    report = run_cli("ema", "--run", str(run), "--sigma-rel", "0.1", "--out", str(out))
    assert report["checkpoints"] == [1, 2]
    weights = linalg.ema_weights([1, 2], 0.1)
    ckpts = [load_file(str(run / "checkpoints" / f"step-{s:08d}" / "adapter_unet.safetensors")) for s in (1, 2)]
    got = load_file(str(out))
    assert got and all(torch.allclose(got[f"unet.{k}"], sum(w * c[k] for w, c in zip(weights, ckpts)), atol=1e-6)
                       for k in ckpts[0])
    assert run_cli("inspect", str(out), "--base", str(tiny_models("sd1")))["adapters"]["unet"]["variant"] == "LoKr"
