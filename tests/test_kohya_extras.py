"""What kohya_ss users look for (issue 16 item 21): clip_skip, continuing from a LoRA file
(network.network_weights), block-wise learning rates (network.block_lr) and a layer filter
(network.exclude_modules). Masked loss is in tests/test_masked_loss.py."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import last_checkpoint, train_run, unet_probe
from trainer_backend.config import ConfigError, load_config, rules


def _model(path):
    from trainer_backend.families import load_model
    return load_model(str(path))


def _adapters(model, overrides):
    """The adapters a run sets up before its first step (methods.setup_method)."""
    from trainer_backend.methods import setup_method
    return setup_method(model, load_config(None, ["network.rank=4", "network.alpha=4", *overrides]))


# ---------------------------------------------------------------- clip_skip

def test_clip_skip_2_is_the_penultimate_hidden_state_through_the_final_layer_norm(tiny_models):
    model = _model(tiny_models("sd1"))
    family, encoder = model.family, model.text_encoders[0]
    ids = family.tokenize(model, ["a red square on a plain background"], 75)
    last = family.encode_text(model, ids)["hidden"]
    model.clip_skip = 2
    skipped = family.encode_text(model, ids)["hidden"]
    with torch.no_grad():
        states = encoder(ids[0], output_hidden_states=True).hidden_states
        assert torch.equal(skipped, encoder.final_layer_norm(states[-2]))
        assert torch.equal(last, encoder.final_layer_norm(states[-1]))  # clip_skip 1: the model's own
    assert not torch.allclose(skipped, last)
    # samples are conditioned on the same embeddings (the pipeline gets them, not the text)
    args = family.prompt_arguments(model, "a red square on a plain background", None)
    assert torch.equal(args["prompt_embeds"], skipped)


@pytest.mark.parametrize("arch", ["sdxl", "sd3", "flux"])
def test_clip_skip_above_1_is_refused_where_it_does_not_apply(arch):
    found = rules.problems(load_config(None, [f"model.arch={arch}", "model.clip_skip=2"]))
    assert [p.key for p in found] == ["model.clip_skip"]
    assert not rules.problems(load_config(None, [f"model.arch={arch}", "model.clip_skip=1"]))


# ---------------------------------------------------------------- block_lr, exclude_modules

def test_block_names_follow_kohyas_numbering_on_the_full_size_unets():
    from trainer_backend.families import get_family
    from trainer_backend.families.base import LoadedModel
    for arch, first_in, last_in, last_out in (("sd1", "IN01", "IN11", "OUT11"), ("sdxl", "IN01", "IN08", "OUT08")):
        family = get_family(arch)
        unet = family.meta_denoiser()
        model = LoadedModel(family, unet, None, [], [], None, "epsilon", "", 8)
        names = {family.block_of(model, n) for n, m in unet.named_modules() if isinstance(m, torch.nn.Linear)}
        ins = sorted(n for n in names if n and n.startswith("IN"))
        assert (ins[0], ins[-1]) == (first_in, last_in)
        assert max(n for n in names if n and n.startswith("OUT")) == last_out
        assert {"M00", "M01", "M02"} <= names
        # kohya: down_blocks.1.attentions.0 is input_blocks.4; up_blocks.1.attentions.2 is output_blocks.5
        assert family.block_of(model, "down_blocks.1.attentions.0.proj_in") == "IN04"
        assert family.block_of(model, "up_blocks.1.attentions.2.proj_in") == "OUT05"
    flux = get_family("flux")
    model = LoadedModel(flux, flux.meta_denoiser(), None, [], [], None, "flow", "", 8)
    names = {flux.block_of(model, n) for n, _ in model.denoiser.named_modules()} - {None}
    assert names == {"BASE", "END", *(f"double_{i:02d}" for i in range(19)), *(f"single_{i:02d}" for i in range(38))}


def test_block_multipliers_become_optimizer_groups_that_follow_the_schedule(tiny_models):
    from trainer_backend.training.optimizers import build_lr_scheduler, build_optimizer
    model = _model(tiny_models("sd1"))
    cfg = load_config(None, ["network.rank=4", "network.alpha=4", "optimizer.lr=1e-3",
                             "optimizer.scheduler=linear", "optimizer.warmup_steps=2",
                             'network.block_lr={"IN*" = 0.5, "OUT00-01" = 0, "OUT01" = 2}'])
    from trainer_backend.methods.lora import setup_lora
    trainable = setup_lora(model, cfg)
    groups = {g["name"]: g["lr"] for g in trainable.param_groups}
    assert groups == {"unet ×1": 1e-3, "unet ×0.5": 5e-4, "unet ×2": 2e-3}  # OUT01: the last key wins
    frozen = [n for n, p in model.denoiser.named_parameters() if "lora_" in n and not p.requires_grad]
    assert frozen and all(n.startswith("up_blocks.0.resnets.0.") or n.startswith("up_blocks.0.attentions.0.")
                          for n in frozen)   # OUT00 only
    optimizer = build_optimizer(cfg, trainable.param_groups)
    scheduler = build_lr_scheduler(cfg, optimizer, total_steps=10)
    for _ in range(3):
        lrs = scheduler.get_last_lr()
        assert lrs[1] == pytest.approx(lrs[0] * 0.5) and lrs[2] == pytest.approx(lrs[0] * 2)
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(1e-3 * 7 / 8)  # warmup done, linear decay


def test_block_lr_and_exclude_modules_that_name_nothing_are_refused(tiny_models):
    model = _model(tiny_models("sd1"))
    with pytest.raises(ConfigError, match=r"network.block_lr: 'OUT99' names no block of this "
                                          r"UNet2DConditionModel; its blocks: .*OUT00"):
        _adapters(model, ['network.block_lr={"OUT99" = 0}'])
    with pytest.raises(ConfigError, match=r"network.exclude_modules: 'nothing_like_this'"):
        _adapters(_model(tiny_models("sd1")), ['network.exclude_modules=["nothing_like_this"]'])
    found = rules.problems(load_config(None, ['network.block_lr={"IN*" = -1}', 'network.exclude_modules=["("]']))
    assert [p.key for p in found] == ["network.block_lr", "network.exclude_modules"]


def test_exclude_modules_leaves_matching_layers_without_adapters(tiny_models):
    model = _model(tiny_models("sd1"))
    _adapters(model, [r'network.exclude_modules=["^down_blocks\\.0\\."]'])
    adapted = [n for n, m in model.denoiser.named_modules() if hasattr(m, "lora_A")]
    assert adapted and not any(n.startswith("down_blocks.0.") for n in adapted)
    assert any(n.startswith("up_blocks.") for n in adapted)


# ---------------------------------------------------------------- network_weights (with block_lr and clip_skip)

@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_models):
    """A short SD1 LoRA run with clip_skip 2 (samples too): its file is what the next run starts from."""
    from accelerate.state import AcceleratorState
    tmp = tmp_path_factory.mktemp("first")
    data = make_dataset(tmp / "data", n=2, size=32)
    run, events, cfg = train_run(tmp, tiny_models("sd1"), data, "first", "schedule.max_steps=2",
                                 "optimizer.lr=1e-2", "model.clip_skip=2", "network.train_text_encoder=true",
                                 "samples.prompts=a red square", "samples.before_first_step=true",
                                 "samples.width=32", "samples.height=32", "samples.steps=2",
                                 "checkpoints.every_n_steps=2")
    AcceleratorState._reset_state(reset_partial_state=True)
    return run / "first.safetensors", run, events, data


def test_a_clip_skip_run_trains_samples_and_says_so_in_the_file(first_run):
    path, run, events, _ = first_run
    assert any(e["event"] == "sample" for e in events)
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata()["ss_clip_skip"] == "2"


def test_adapters_start_from_the_file_exactly(first_run, tiny_models):
    path, run, _, _ = first_run
    model = _model(tiny_models("sd1"))
    overrides = ["network.train_text_encoder=true", "network.alpha=1", f"network.network_weights={path}"]
    trainable = _adapters(model, overrides)   # alpha 1 instead of the file's 4: folded into lora_B
    final = load_file(str(last_checkpoint(run) / "adapter_unet.safetensors"))
    state = trainable.state_dict("unet")
    assert set(state) == set(final)
    for key, value in final.items():
        expected = value * 4 if key.endswith("lora_B.weight") else value
        torch.testing.assert_close(state[key], expected, rtol=1e-6, atol=0)
    # the denoiser does at step 0 what the first run's denoiser did at its end
    first = _model(tiny_models("sd1"))
    ended = _adapters(first, ["network.train_text_encoder=true"])
    ended.load_state_dict("unet", final)
    torch.testing.assert_close(unet_probe(model.denoiser), unet_probe(first.denoiser), rtol=1e-5, atol=1e-6)


def test_a_file_of_another_rank_is_refused_naming_the_key_and_both_shapes(first_run, tiny_models):
    path, *_ = first_run
    model = _model(tiny_models("sd1"))
    with pytest.raises(ConfigError) as e:
        _adapters(model, ["network.rank=8", "network.train_text_encoder=true", f"network.network_weights={path}"])
    message = str(e.value)
    assert message.startswith("network.network_weights: ") and "lora_A.weight has shape (4, " in message
    assert "but (8, " in message
    with pytest.raises(ConfigError, match="network.network_weights: .*text_encoder"):
        _adapters(_model(tiny_models("sd1")), [f"network.network_weights={path}"])  # te adapters, te untrained


def test_continuing_with_a_frozen_block_keeps_its_loaded_weights(first_run, tiny_models, tmp_path):
    path, _, _, data = first_run
    run, _, _ = train_run(tmp_path, tiny_models("sd1"), data, "second", "schedule.max_steps=2", "optimizer.lr=1e-2",
                          "network.train_text_encoder=true", f"network.network_weights={path}",
                          'network.block_lr={"IN*" = 0}')
    before, after = load_file(str(path)), load_file(str(run / "second.safetensors"))
    assert set(before) == set(after)
    frozen = [k for k in before if k.startswith("lora_unet_down_blocks")]
    trained = [k for k in before if k.startswith("lora_unet_up_blocks") and "lora_up" in k]
    assert frozen and trained
    assert all(torch.equal(before[k], after[k]) for k in frozen)
    assert all(not torch.equal(before[k], after[k]) for k in trained)


def test_a_flux_file_in_diffusers_layout_starts_the_adapters_with_its_effect(tiny_models, tmp_path):
    """The flow families' own layout folds alpha into lora_B; a run with another alpha starts from
    exactly the file's effect."""
    from trainer_backend.methods.kohya_format import save_lora_file
    from trainer_backend.methods.lora import adapter_state_dicts, alpha_for_module
    model = _model(tiny_models("flux"))
    cfg = load_config(None, ["network.rank=4", "network.alpha=4"])
    trained = _adapters(model, [])
    torch.manual_seed(0)
    for p in trained.parameters():
        torch.nn.init.normal_(p, std=0.05)
    path = save_lora_file(tmp_path / "flux.safetensors", model, adapter_state_dicts(trained.modules),
                          alpha=alpha_for_module(cfg), metadata={})
    fresh = _model(tiny_models("flux"))
    _adapters(fresh, ["network.alpha=1", f"network.network_weights={path}"])
    family, g = model.family, torch.Generator().manual_seed(1)
    latents, text = torch.randn(1, 16, 8, 8, generator=g), None
    with torch.no_grad():
        text = family.encode_text(model, family.tokenize(model, ["a cat"], 75))
        outs = [family.predict(m, m.denoiser, latents, torch.tensor([500.0]), text, {}, torch.float32)
                for m in (model, fresh)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
