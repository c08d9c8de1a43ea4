"""LoRA tools (issue 33, items 5-11): merge, mix, resize, extract, post-hoc EMA and inspect, on every
family's tiny model in fp32, in the layouts the project writes; numbers checked as a user would."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors import safe_open

from test_family_conformance import _control_argument, _guidance
from trainer_backend.__main__ import main as cli
from trainer_backend.config import load_config
from trainer_backend.families import load_model
from trainer_backend.families.registry import FAMILY_NAMES, get_family
from trainer_backend.lora_tools import linalg
from trainer_backend.lora_tools.files import components, read_lora

# every family in every layout it writes; in the default run a UNet family and Flux's two layouts (fused q/k/v
# kohya, diffusers), the rest with -m slow (~3 min on 2 cores: mostly building the tiny models)
FAST = {("sd1", "kohya"), ("flux", "kohya"), ("flux", "diffusers")}
LAYOUTS = [pytest.param(name, layout, marks=() if (name, layout) in FAST else pytest.mark.slow)
           for name in FAMILY_NAMES for layout in get_family(name).lora_layouts()]


def make_lora(model_dir, path, layout="auto", rank=4, seed=0, conv_rank=0, alpha=2.0):
    """A LoRA file written by the project's own writer (the family's layout, kohya metadata), with random
    lora_B so it changes the output."""
    from trainer_backend.methods.kohya_format import save_lora_file
    from trainer_backend.methods.lora import adapter_state_dicts, alpha_for_module, setup_lora
    model = load_model(str(model_dir))
    cfg = load_config(None, [f"network.rank={rank}", f"network.alpha={alpha}", f"network.conv_rank={conv_rank}",
                             f"network.conv_alpha={alpha}"])
    trainable = setup_lora(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainable.modules[model.family.denoiser_name].named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    state = adapter_state_dicts(trainable.modules)
    if "diffusers" in model.family.lora_layouts():  # the same adapters in diffusers' layout: what diffusers
        twin = Path(path).with_name(Path(path).stem + "-diffusers.safetensors")  # loads at every tiny size
        save_lora_file(twin, model, state, alpha=alpha_for_module(cfg), metadata={}, layout="diffusers")
    return save_lora_file(path, model, state, alpha=alpha_for_module(cfg),
                          metadata=model.family.lora_metadata(), layout=layout)


def diffusers_readable(lora: Path) -> Path:
    """The file diffusers' load_lora_weights reads for the comparison: the diffusers-layout twin where the
    family writes one (diffusers' kohya-Flux/SD3 converters assume full-size widths), else the file itself."""
    twin = lora.with_name(lora.stem + "-diffusers.safetensors")
    return twin if twin.is_file() else lora


def lora_deltas(model_dir, path) -> dict:
    model = load_model(str(model_dir))
    return {k: linalg.delta(a, b, s) for k, (a, b, s) in read_lora(model, path).modules.items()}


def image(pipe, family):
    g = torch.Generator().manual_seed(0)
    return torch.from_numpy(pipe(prompt="a red square", num_inference_steps=2, height=32, width=32, generator=g,
                                 output_type="np", **_control_argument(family), **_guidance(pipe, family)).images[0])


def run_cli(*argv) -> dict:
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["lora", *argv]) == 0
    return json.loads(out.getvalue())


# ---- the arithmetic (pure)

@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 4), st.integers(0, 10_000))
def test_full_rank_factor_reproduces_and_energy_matches_the_residual(out_dim, in_dim, rank, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(out_dim, in_dim, generator=g, dtype=torch.float64).float()
    a, b, kept = linalg.factor(m, rank=min(out_dim, in_dim))
    assert torch.allclose(b @ a, m, atol=1e-5) and kept == pytest.approx(1.0)
    a, b, kept = linalg.factor(m, rank=rank)
    residual = float((m - b @ a).pow(2).sum() / m.pow(2).sum())
    assert kept == pytest.approx(1 - residual, abs=1e-4)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=8, unique=True), st.floats(0.01, 0.28))
def test_ema_weights_sum_to_one_and_longer_ema_looks_further_back(steps, sigma):
    steps = sorted(steps)
    w = linalg.ema_weights(steps, sigma)
    assert sum(w) == pytest.approx(1.0) and all(x >= 0 for x in w)
    if len(steps) > 1:  # a longer EMA (larger σ_rel) gives the last snapshot less weight
        assert linalg.ema_weights(steps, min(sigma + 0.005, 0.285))[-1] <= w[-1] + 1e-12


def test_sigma_rel_to_gamma_matches_the_paper():
    # Karras et al. 2024 (EDM2): σ_rel 0.05 ≈ γ 16.97, σ_rel 0.10 ≈ γ 6.94
    assert linalg.sigma_rel_to_gamma(0.05) == pytest.approx(16.97, abs=0.01)
    assert linalg.sigma_rel_to_gamma(0.10) == pytest.approx(6.94, abs=0.01)


# ---- merge: == the base with the LoRA loaded through diffusers, every family and layout

@pytest.mark.parametrize("arch,layout", LAYOUTS)
def test_merge_equals_the_lora_loaded_through_diffusers(arch, layout, tiny_models, tmp_path):
    family = get_family(arch)
    lora = make_lora(tiny_models(arch), tmp_path / "in.safetensors", layout)
    report = run_cli("merge", "--base", str(tiny_models(arch)), "--lora", f"{lora}:0.7", "--out", str(tmp_path / "m"))
    assert (tmp_path / "m.safetensors").is_file() and (tmp_path / "m").is_dir() and report["merged_modules"] > 0
    base = load_model(str(tiny_models(arch)))
    pipe = family.build_pipeline(base)
    pipe.load_lora_weights(str(diffusers_readable(lora)), adapter_name="x")
    pipe.set_adapters(["x"], [0.7])
    want = image(pipe, family)
    merged = load_model(str(tmp_path / "m"))
    got = image(family.build_pipeline(merged), family)
    plain = image(family.build_pipeline(load_model(str(tiny_models(arch)))), family)
    assert (want - plain).abs().max() > 1e-3, "the LoRA does nothing: the comparison would prove nothing"
    assert (got - want).abs().max() < 1e-4


# ---- resize, mix, extract on the weights (every family's writer and reader)

@pytest.mark.parametrize("arch,layout", LAYOUTS)
def test_resize_full_rank_unchanged_half_rank_energy(arch, layout, tiny_models, tmp_path):
    model_dir = tiny_models(arch)
    lora = make_lora(model_dir, tmp_path / "in.safetensors", layout, rank=4)
    run_cli("resize", str(lora), "--base", str(model_dir), "--rank", "4", "--out", str(tmp_path / "full.safetensors"))
    before, after = lora_deltas(model_dir, lora), lora_deltas(model_dir, tmp_path / "full.safetensors")
    assert before.keys() == after.keys()
    assert max(float((before[k] - after[k]).abs().max()) for k in before) < 1e-5
    report = run_cli("resize", str(lora), "--base", str(model_dir), "--rank", "2", "--out", str(tmp_path / "half.safetensors"))
    half = lora_deltas(model_dir, tmp_path / "half.safetensors")
    for (component, module), d in before.items():
        residual = float((d - half[(component, module)]).pow(2).sum() / d.pow(2).sum())
        assert report["kept_energy"][f"{component}.{module}"] == pytest.approx(1 - residual, abs=1e-4)
    with safe_open(str(tmp_path / "half.safetensors"), "pt") as f:
        assert f.metadata()["ss_network_dim"] == "2"


def test_mix_concatenates_exactly_and_refuses_to_overwrite(tiny_models, tmp_path):
    model_dir = tiny_models("sd1")
    one = make_lora(model_dir, tmp_path / "one.safetensors", seed=1)
    two = make_lora(model_dir, tmp_path / "two.safetensors", seed=2, rank=2)
    report = run_cli("mix", f"{one}:0.5", f"{two}:-1", "--base", str(model_dir), "--out", str(tmp_path / "mix.safetensors"))
    assert report["ranks"] == {"6": len(lora_deltas(model_dir, one))}
    d1, d2, mixed = (lora_deltas(model_dir, p) for p in (one, two, tmp_path / "mix.safetensors"))
    assert max(float((0.5 * d1[k] - d2[k] - mixed[k]).abs().max()) for k in d1) < 1e-6
    assert cli(["lora", "mix", f"{one}:1", "--base", str(model_dir), "--out", str(one)]) == 2  # the input
    assert cli(["lora", "resize", str(one), "--base", str(model_dir), "--rank", "1",
                "--out", str(tmp_path / "mix.safetensors")]) == 2  # exists, no --force


def test_a_lora_for_another_model_is_refused_naming_keys_and_shapes(tiny_models, tmp_path, capsys):
    lora = make_lora(tiny_models("sd1"), tmp_path / "sd1.safetensors")
    assert cli(["lora", "merge", "--base", str(tiny_models("sdxl")), "--lora", str(lora),
                "--out", str(tmp_path / "m")]) == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "sd1.safetensors" in err
    assert "lora_A (4, " in err or "names no layer" in err
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize("arch", ["sd1", "flux"])
def test_extract_full_rank_reproduces_the_tuned_model(arch, tiny_models, tmp_path):
    """tuned = base + a random change of every adapted layer (and, for SD, the convolutions: LoCon)."""
    family = get_family(arch)
    base = load_model(str(tiny_models(arch)))
    g = torch.Generator().manual_seed(3)
    targets = family.default_targets or ("to_q", "to_k", "to_v", "to_out.0")
    with torch.no_grad():
        for name, layer in base.denoiser.named_modules():
            if isinstance(layer, torch.nn.Conv2d) or (isinstance(layer, torch.nn.Linear) and
                                                      any(name == t or name.endswith("." + t) for t in targets)):
                layer.weight.add_(torch.randn(layer.weight.shape, generator=g) * 0.02)
    family.save_full_model(base, tmp_path / "tuned", tmp_path / "tuned.safetensors")
    full = max(max(m.weight.shape[0], m.weight[0].numel()) for m in base.denoiser.modules()
               if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)))
    report = run_cli("extract", "--base", str(tiny_models(arch)), "--tuned", str(tmp_path / "tuned"),
                     "--rank", str(full), "--conv-rank", str(full), "--out", str(tmp_path / "x.safetensors"))
    assert report["min_kept_energy"] == pytest.approx(1.0)
    run_cli("merge", "--base", str(tiny_models(arch)), "--lora", str(tmp_path / "x.safetensors"),
            "--out", str(tmp_path / "back"))
    back, tuned = load_model(str(tmp_path / "back")), load_model(str(tmp_path / "tuned"))
    tuned_weights = dict(tuned.denoiser.named_parameters())
    worst = max(float((p - tuned_weights[n]).abs().max()) for n, p in back.denoiser.named_parameters())
    assert worst < 1e-4


def test_inspect_reports_layout_ranks_and_fit(tiny_models, tmp_path):
    lora = make_lora(tiny_models("sd1"), tmp_path / "in.safetensors", rank=4, conv_rank=2)
    report = run_cli("inspect", str(lora), "--base", str(tiny_models("sd1")))
    assert report["layout"].startswith("kohya") and report["family"] == "sd1"
    assert report["ranks"]["4"] > 0 and report["ranks"]["2"] == report["conv_modules"] > 0
    assert report["alphas"] == [2.0] and report["base"]["fits"] is True
    assert report["parameters"] == sum(t.numel() for t in __import__("safetensors.torch", fromlist=["x"])
                                       .load_file(str(lora)).values())
    other = run_cli("inspect", str(lora), "--base", str(tiny_models("sdxl")))
    assert other["base"]["fits"] is False and "in.safetensors" in other["base"]["problem"]


def test_post_hoc_ema_averages_the_checkpoints(tiny_models, tmp_path):
    """A real run saving 3 checkpoints; the EMA file is Σ wᵢ · checkpointᵢ with Karras's weights."""
    from safetensors.torch import load_file
    from conftest import make_dataset
    from method_runs import train_run
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, _, cfg = train_run(tmp_path, tiny_models("sd1"), data, "ema", "schedule.max_steps=3", "optimizer.lr=1e-2",
                            "checkpoints.every_n_steps=1", "checkpoints.keep_last=5")
    report = run_cli("ema", "--run", str(run), "--sigma-rel", "0.1", "--out", str(tmp_path / "ema.safetensors"))
    assert report["checkpoints"] == [1, 2, 3]
    weights = linalg.ema_weights([1, 2, 3], 0.1)
    ckpts = [load_file(str(run / "checkpoints" / f"step-{s:08d}" / "adapter_unet.safetensors")) for s in (1, 2, 3)]
    model = load_model(str(tiny_models("sd1")))
    got = read_lora(model, tmp_path / "ema.safetensors").modules
    for (component, module), (a, b, scale) in got.items():
        want_a = sum(w * c[f"{module}.lora_A.weight"] for w, c in zip(weights, ckpts))
        assert torch.allclose(a.float(), want_a, atol=1e-6)
    several = run_cli("ema", "--run", str(run), "--sigma-rel", "0.05..0.2", "--out", str(tmp_path / "e.safetensors"))
    assert [o["sigma_rel"] for o in several["outputs"]] == [0.05, 0.1, 0.15, 0.2]
    assert (tmp_path / "e-sigma0.05.safetensors").is_file()


def test_a_stopped_merge_job_leaves_no_partial_outputs(tiny_models, tmp_path, monkeypatch):
    """The queue's Stop (SIGTERM) while the merged model is being written: the job ends `stopped`, and neither
    `<out>.partial/`, `<out>/` nor a half-written `<out>.safetensors` is left behind."""
    import os
    import signal
    from trainer_backend.jobqueue.progress import ending_status, run_progress
    family_class = type(get_family("sd1"))
    real_save = family_class.save_full_model

    def save_then_stop(self, model, folder, single, metadata=None):
        real_save(self, model, folder, single, metadata=metadata)  # both outputs exist now, in full
        assert Path(folder).is_dir() and Path(single).is_file()
        os.kill(os.getpid(), signal.SIGTERM)   # the handler runs at the next bytecode, before the rename
        raise AssertionError("the stop did not interrupt the merge")

    monkeypatch.setattr(family_class, "save_full_model", save_then_stop)
    lora = make_lora(tiny_models("sd1"), tmp_path / "in.safetensors")
    job = tmp_path / "job"
    job.mkdir()
    before = signal.getsignal(signal.SIGTERM)
    code = cli(["lora", "merge", "--base", str(tiny_models("sd1")), "--lora", str(lora), "--out",
                str(tmp_path / "m"), "--job-dir", str(job)])
    assert code == 75
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.safetensors", "job"]
    assert ending_status(run_progress(job)["ending"]) == "stopped"
    assert signal.getsignal(signal.SIGTERM) is before   # the tool's handler is gone with the job
