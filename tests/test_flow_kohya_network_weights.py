"""network.network_weights = a kohya-layout SD3 or Flux LoRA file (`lora_unet_joint_blocks_0_x_block_attn_qkv…`,
`lora_unet_double_blocks_…`, `lora_te1_…`/`lora_te2_…`): the fused q/k/v (and Flux's linear1) adapters
split back onto the diffusers modules, so a run starts from exactly the file's weights and goes on
training. Files written by kohya's own tools (one dense adapter on the fused layer) start with the
same update too."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import make_dataset
from method_runs import last_checkpoint, train_run
from trainer_backend.config import ConfigError, load_config
from trainer_backend.families import load_model

COMPONENTS = {"sd3": ("transformer", "text_encoder", "text_encoder_2"), "flux": ("transformer", "text_encoder")}


def _adapters(model, overrides):
    """The adapters a run sets up before its first step (methods.setup_method)."""
    from trainer_backend.methods import setup_method
    return setup_method(model, load_config(None, ["network.rank=4", "network.alpha=4", *overrides]))


def _prediction(model) -> torch.Tensor:
    family, g = model.family, torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, 8, 8, generator=g)
    with torch.no_grad():
        text = family.encode_text(model, family.tokenize(model, ["a red square"], 75))
        return family.predict(model, model.denoiser, latents, torch.tensor([500.0]), text, {}, torch.float32)


@pytest.fixture(scope="module", params=["sd3", "flux"])
def kohya_run(request, tmp_path_factory, tiny_models):
    """One step of a tiny run (CLIP trained too) written in kohya's layout, with its checkpoint."""
    arch = request.param
    tmp = tmp_path_factory.mktemp(f"kohya-{arch}")
    data = make_dataset(tmp / "data", n=2, size=32)
    run, _, _ = train_run(tmp, tiny_models(arch), data, "first", "output.lora_format=kohya", "schedule.max_steps=1",
                          "optimizer.lr=1e-2", "network.train_text_encoder=true", "checkpoints.every_n_steps=1")
    return arch, run / "first.safetensors", last_checkpoint(run), data


def test_adapters_start_from_the_kohya_file_exactly(kohya_run, tiny_models):
    """Every trained adapter (the fused qkv split back into q, k and v) starts with the run's final
    weights; alpha 1 instead of the file's 4 is folded into lora_B; the transformer predicts what
    the first run's transformer predicted at its end."""
    arch, path, checkpoint, _ = kohya_run
    assert any(k.startswith("lora_unet_") and "qkv" in k for k in load_file(str(path)))
    model = load_model(str(tiny_models(arch)))
    trainable = _adapters(model, ["network.train_text_encoder=true", "network.alpha=1",
                                  f"network.network_weights={path}"])
    ended = load_model(str(tiny_models(arch)))
    ended_adapters = _adapters(ended, ["network.train_text_encoder=true"])
    for component in COMPONENTS[arch]:
        final = load_file(str(checkpoint / f"adapter_{component}.safetensors"))
        state = trainable.state_dict(component)
        assert set(state) == set(final), component
        for key, value in final.items():
            expected = value * 4 if key.endswith("lora_B.weight") else value
            torch.testing.assert_close(state[key], expected, rtol=1e-6, atol=1e-6, msg=lambda m: f"{key}: {m}")
        ended_adapters.load_state_dict(component, final)
    torch.testing.assert_close(_prediction(model), _prediction(ended), rtol=1e-5, atol=1e-6)


def test_a_run_continues_from_the_kohya_file(kohya_run, tiny_models, tmp_path):
    """A second run starting from the file trains on: its first Adam step moves each weight by at most
    the learning rate from the file's value (a run from scratch would start elsewhere), and it moves."""
    arch, path, _, data = kohya_run
    run, events, _ = train_run(tmp_path, tiny_models(arch), data, "second", "output.lora_format=kohya",
                               "schedule.max_steps=1", "optimizer.lr=1e-3", "network.train_text_encoder=true",
                               f"network.network_weights={path}")
    assert [e["step"] for e in events if e["event"] == "step"] == [1]
    before, after = load_file(str(path)), load_file(str(run / "second.safetensors"))
    assert set(before) == set(after)
    moved = max((after[k] - before[k]).abs().max().item() for k in before if not k.endswith(".alpha"))
    assert 1e-5 < moved <= 1.05e-3, moved


def test_a_dense_kohya_qkv_adapter_gives_each_part_its_rows(tiny_models):
    """kohya's own files put one adapter of the run's rank on a fused qkv (not block-diagonal): each of
    q, k and v starts with the whole down matrix and its own rows of up, the file's alpha/rank applied."""
    model = load_model(str(tiny_models("sd3")))
    targets = json.dumps(["to_q", "to_k", "to_v"])
    _adapters(model, [f"network.target_modules={targets}", "network.alpha=4"])
    block = model.denoiser.transformer_blocks[0].attn
    width, g = block.to_q.in_features, torch.Generator().manual_seed(3)
    down, up = torch.randn(4, width, generator=g), torch.randn(3 * block.to_q.out_features, 4, generator=g)
    file_state = {"lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight": down,
                  "lora_unet_joint_blocks_0_x_block_attn_qkv.lora_up.weight": up,
                  "lora_unet_joint_blocks_0_x_block_attn_qkv.alpha": torch.tensor(2.0)}
    found = model.family.read_lora_file(model, file_state, {"transformer": model.denoiser})
    rows = up.chunk(3)
    for i, part in enumerate(("to_q", "to_k", "to_v")):
        module = f"transformer_blocks.0.attn.{part}"
        weights = found.weights["transformer"]
        a, b = weights[f"{module}.lora_A.weight"], weights[f"{module}.lora_B.weight"]
        scale = found.scales[("transformer", module)]
        torch.testing.assert_close(scale * b @ a, 0.5 * rows[i] @ down)


def test_a_kohya_file_on_modules_the_run_does_not_adapt_is_refused_by_name(tiny_models, tmp_path):
    model = load_model(str(tiny_models("flux")))
    targets = json.dumps(["to_out.0"])
    path = tmp_path / "qkv.safetensors"
    out_features = model.denoiser.transformer_blocks[0].attn.to_q.out_features
    save_file({"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": torch.ones(2, out_features),
               "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": torch.ones(3 * out_features, 2),
               "lora_unet_double_blocks_0_img_attn_qkv.alpha": torch.tensor(2.0)}, str(path))
    with pytest.raises(ConfigError, match=r"network.network_weights: .*double_blocks_0_img_attn_qkv adapts "
                                          r"transformer_blocks.0.attn.to_q"):
        _adapters(model, [f"network.target_modules={targets}", f"network.network_weights={path}"])
    save_file({"lora_unet_no_such_block.lora_down.weight": torch.ones(2, 4),
               "lora_unet_no_such_block.lora_up.weight": torch.ones(4, 2)}, str(path))
    with pytest.raises(ConfigError, match="network.network_weights: lora_unet_no_such_block is not a module"):
        _adapters(load_model(str(tiny_models("flux"))), [f"network.network_weights={path}"])
