"""Krea 2 beyond the conformance suite (which trains Raw and Turbo end to end): the text conditioning
and the training forward call are what Krea2Pipeline computes on the same inputs, and each checkpoint
trains with the shift its pipeline samples with (Raw: resolution-dependent; Turbo: the fixed mu = 1.15)."""
from __future__ import annotations

import math

import pytest
import torch

from trainer_backend.config import load_config
from trainer_backend.families import load_model


@pytest.fixture(scope="module")
def raw(tiny_models):
    model = load_model(str(tiny_models("krea2")))
    return model, model.family.build_pipeline(model)


def test_text_conditioning_is_what_the_pipeline_encodes(raw):
    """The fixed [prefix | caption | padding | suffix] block, real-token positions, the tapped layers
    stacked per token, the prefix dropped: equal to encode_prompt for captions of different lengths."""
    model, pipe = raw
    family = model.family
    captions = ["a red square", "a small blue circle on a plain white background"]
    with torch.no_grad():
        ours = family.encode_text(model, family.tokenize(model, captions, 75))
        theirs, mask = pipe.encode_prompt(prompt=captions, device=torch.device("cpu"), max_sequence_length=512)
    assert ours["hidden"].shape == theirs.shape and theirs.shape[2] == 2  # two tapped layers
    assert torch.equal(ours["mask"], mask) and not mask.all()
    torch.testing.assert_close(ours["hidden"], theirs, rtol=1e-5, atol=1e-5)


def test_the_training_forward_call_is_the_pipelines_transformer_call(raw):
    model, pipe = raw
    family = model.family
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        text = family.encode_text(model, family.tokenize(model, ["a red square"], 75))
        ours = family.predict(model, model.denoiser, latents, torch.tensor([500.0]), text, {}, torch.float32)
        embeds, mask = pipe.encode_prompt(prompt=["a red square"], device=torch.device("cpu"))
        positions = pipe.prepare_position_ids(embeds.shape[1], 4, 4, torch.device("cpu"))
        out = pipe.transformer(hidden_states=pipe._pack_latents(latents, 1, 4, 8, 8), encoder_hidden_states=embeds,
                               timestep=torch.tensor([0.5]), position_ids=positions, encoder_attention_mask=mask,
                               return_dict=False)[0]
    torch.testing.assert_close(ours, pipe._unpack_latents(out, 64, 64)[:, :, 0], rtol=1e-5, atol=1e-5)


def test_raw_and_turbo_train_with_the_shift_their_pipelines_sample_with(raw, tiny_models):
    from diffusers.pipelines.krea2.pipeline_krea2 import calculate_shift
    loss = load_config(None, []).loss
    model, pipe = raw
    c = model.scheduler_config
    # Raw at 1024²: a 128×128 latent, 64×64 = 4096 packed tokens
    mu = calculate_shift(4096, c["base_image_seq_len"], c["max_image_seq_len"], c["base_shift"], c["max_shift"])
    assert model.family.objective(model)._shift((16, 128, 128), loss) == pytest.approx(math.exp(mu))
    assert not pipe.config.is_distilled
    turbo = load_model(str(tiny_models("krea2-turbo")))
    assert turbo.family.build_pipeline(turbo).config.is_distilled
    for side in (64, 128):  # fixed, whatever the size
        assert turbo.family.objective(turbo)._shift((16, side, side), loss) == pytest.approx(math.exp(1.15))


def test_the_original_layout_on_the_full_size_model_converts_back_through_diffusers():
    """ComfyUI's / Krea's reference-trainer names (diffusion_model.blocks.N.attn.wq …) written for every
    adapted module of the full-size transformer (meta device) land, through diffusers' own converter, on
    exactly those modules."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from trainer_backend.families import get_family
    family = get_family("krea2")
    denoiser = family.meta_denoiser()
    denoiser.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=list(family.default_targets)))
    adapted = {name for name, m in denoiser.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}

    class Model:
        pass
    model = Model()
    model.family, model.denoiser = family, denoiser
    written = family.lora_file_state(model, {"transformer": state}, 1.0, "original")
    assert all(k.startswith(("diffusion_model.blocks.", "diffusion_model.txtfusion.")) for k in written)
    assert "diffusion_model.blocks.0.attn.wq.lora_A.weight" in written
    assert family.diffusers_lora_targets(written, denoiser) == adapted and len(adapted) == (28 + 4) * 8  # the text fusion's 4 blocks too


def test_a_hub_id_of_turbo_downloads_and_loads_as_turbo(tiny_models, tmp_path, monkeypatch):
    from hub_server import HubServer, point_client_at
    from trainer_backend.model_sources import resolve_model
    server = HubServer().start()
    try:
        server.add_folder("org/tiny-krea-2-turbo", tiny_models("krea2-turbo"))
        point_client_at(monkeypatch, server, tmp_path / "hf")
        folder = resolve_model("org/tiny-krea-2-turbo")
    finally:
        server.stop()
    loaded = load_model(str(folder))
    assert loaded.family.name == "krea2" and loaded.family.base_model_version_of(loaded) == "krea2_turbo"


def test_the_full_size_transformer_file_layout_converts_back_through_diffusers():
    """Every weight of the full-size transformer (meta device) written in the original layout comes back
    under its own name and shape through diffusers' convert_krea2_transformer_checkpoint_to_diffusers."""
    from diffusers.loaders.single_file_utils import convert_krea2_transformer_checkpoint_to_diffusers
    from trainer_backend.families import get_family
    from trainer_backend.families.krea2.single_file import to_original
    state = get_family("krea2").meta_denoiser().state_dict()
    original = to_original(state)
    assert "blocks.0.attn.wq.weight" in original and original["blocks.0.mod.lin"].dim() == 1
    back = convert_krea2_transformer_checkpoint_to_diffusers(dict(original))
    assert back.keys() == state.keys() and all(back[k].shape == state[k].shape for k in state)


def test_a_batch_gradient_is_the_mean_of_its_samples_gradients_in_float64(raw):
    """Why the conformance suite's accumulation check (batch 4 vs 1 × accum 4, relative 1e-5) sits close to
    its tolerance for Krea 2: in float32 one batch's gradient already differs from the mean of its samples'
    gradients by a few 1e-6 (a 4-caption batch runs other matmul shapes over the 512-token caption block, so
    sums round in another order), and SGD at lr 0.5 carries that through 8 steps. In float64 the two agree to
    rounding (1e-12): the batch conditions each sample exactly as it would alone; the gap is float order."""
    import copy

    from trainer_backend.diffusion.loss import diffusion_loss
    model, _ = raw
    cfg = load_config(None, [])
    captions = ["a red square", "a small blue circle on a plain white background", "green", "a yellow triangle"]
    latents = torch.randn(4, 4, 4, 4, generator=torch.Generator().manual_seed(0))

    def gradients(indices, dtype):
        denoiser = copy.deepcopy(model.denoiser).to(dtype)
        encoders = [copy.deepcopy(model.text_encoders[0]).to(dtype)]
        batch = {"latents": latents[indices], "caption": [captions[i] for i in indices], "index": indices}
        diffusion_loss(model, denoiser, batch, cfg=cfg, epoch=0, device=torch.device("cpu"), weight_dtype=dtype,
                       text_encoders=encoders).backward()
        return {n: p.grad for n, p in denoiser.named_parameters() if p.grad is not None}

    def worst(dtype):
        batch, alone = gradients([0, 1, 2, 3], dtype), [gradients([i], dtype) for i in range(4)]
        return max(((batch[n] - sum(a[n] for a in alone) / 4).abs().max() / batch[n].abs().max()).item()
                   for n in batch)
    assert worst(torch.float64) < 1e-12
    assert worst(torch.float32) < 1e-4  # float order only: the size the accumulation check's margin reflects
