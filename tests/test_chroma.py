"""Chroma as a Flux variant: the original (ComfyUI) layout of the full-size transformer is what
diffusers' Chroma converter reads; training calls the transformer exactly as ChromaPipeline samples
(T5 padding mask, timestep, positions); LoRA files in both layouts carry the trained update (the
diffusers one through ChromaPipeline.load_lora_weights, the kohya one merged as ComfyUI merges it);
a Chroma single file is told apart from Flux's."""
from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import save_file

from trainer_backend.errors import ConfigError
from lora_checks import adapted_modules, model_of
from trainer_backend.families import get_family, load_model
from trainer_backend.families.flux.kohya_lora import merge_into_original
from trainer_backend.families.flux.single_file import export_transformer, from_original, to_original

CHROMA = get_family("chroma")



def test_full_size_original_layout_is_what_diffusers_chroma_converter_reads():
    from diffusers.loaders.single_file_utils import convert_chroma_transformer_checkpoint_to_diffusers
    denoiser = CHROMA.meta_denoiser()
    state = denoiser.state_dict()
    original = to_original(state, dict(denoiser.config))
    assert "distilled_guidance_layer.norms.4.scale" in original and "single_blocks.37.linear1.weight" in original
    assert not any("img_mod" in k or "adaLN" in k or k.startswith(("time_in", "vector_in")) for k in original)
    left = dict(original)
    converted = convert_chroma_transformer_checkpoint_to_diffusers(left)
    assert not left, f"keys diffusers' converter does not read: {sorted(left)[:5]}"
    assert converted.keys() == state.keys()
    assert all(converted[k].shape == state[k].shape for k in state)


def test_full_size_kohya_layout_names_original_modules_that_diffusers_reads_back():
    denoiser = CHROMA.meta_denoiser()
    denoiser.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=list(CHROMA.default_targets)))
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}
    written = CHROMA.lora_file_state(model_of(CHROMA, denoiser), {"transformer": state}, 1.0, "kohya")
    names = {k.split(".")[0] for k in written}
    assert "lora_unet_double_blocks_18_txt_attn_qkv" in names and "lora_unet_single_blocks_37_linear1" in names
    assert len(names) == 19 * 4 + 38
    assert CHROMA.diffusers_lora_targets(written, denoiser) == adapted_modules(denoiser)


@pytest.fixture(scope="module")
def trained(tiny_models):
    """The tiny model with random adapters (what training leaves: non-zero lora_B), alpha ≠ rank."""
    model = load_model(str(tiny_models("chroma")))
    model.denoiser.add_adapter(LoraConfig(r=4, lora_alpha=2, target_modules=list(CHROMA.default_targets)))
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=g) * 0.2 for k, v in get_peft_model_state_dict(model.denoiser).items()}
    set_peft_model_state_dict(model.denoiser, state)
    return model, state


def _pipeline_call(pipe, prompt: str) -> tuple[dict, torch.Tensor]:
    """One sampling step of ChromaPipeline without guidance: the transformer's inputs and output."""
    seen = {}

    def hook(_module, _args, kwargs, output):
        seen.update(kwargs=kwargs, output=output[0])
    handle = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    try:
        pipe(prompt=prompt, num_inference_steps=1, height=64, width=64, guidance_scale=1.0, output_type="latent",
             generator=torch.Generator().manual_seed(0), max_sequence_length=32)
    finally:
        handle.remove()
    return seen["kwargs"], seen["output"]


def test_training_calls_the_transformer_as_chroma_pipeline_samples(trained):
    """The family's training forward, on the pipeline's own latents and timestep, gives the pipeline's
    prediction: same T5 states, the same padding mask (one padding token visible), same positions."""
    model, _ = trained
    pipe = CHROMA.build_pipeline(model)
    prompt = "a red square"  # far shorter than the 32 tokens: most of the T5 sequence is padding
    kwargs, want = _pipeline_call(pipe, prompt)
    mask = kwargs["attention_mask"]
    assert mask is not None and 0 < int(mask[0, :32].sum()) < 32, "the pipeline masks the T5 padding"
    text = CHROMA.encode_text(model, CHROMA.tokenize(model, [prompt], 75))
    noisy = pipe._unpack_latents(kwargs["hidden_states"], 64, 64, pipe.vae_scale_factor)
    with torch.no_grad():
        got = CHROMA.predict(model, model.denoiser, noisy, kwargs["timestep"] * 1000, text, {}, torch.float32)
    want = pipe._unpack_latents(want, 64, 64, pipe.vae_scale_factor)
    assert (got - want).abs().max() <= 1e-5
    # and the mask matters: with every padding token visible the prediction differs
    text["mask"] = torch.ones_like(text["mask"])
    with torch.no_grad():
        unmasked = CHROMA.predict(model, model.denoiser, noisy, kwargs["timestep"] * 1000, text, {}, torch.float32)
    assert (unmasked - want).abs().max() > 1e-4


def test_gradient_checkpointing_keeps_the_padding_mask(tiny_models):
    """precision.gradient_checkpointing: the same prediction and gradients as without it (diffusers'
    checkpointed single-block call leaves the mask out; the family hands it over)."""
    model = load_model(str(tiny_models("chroma")))
    text = CHROMA.encode_text(model, CHROMA.tokenize(model, ["a red square"], 75))
    text = {k: v.detach() for k, v in text.items()}
    noisy = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(2))

    def run():
        model.denoiser.zero_grad()
        out = CHROMA.predict(model, model.denoiser, noisy, torch.tensor([500.0]), text, {}, torch.float32)
        out.square().mean().backward()
        grad = model.denoiser.single_transformer_blocks[0].attn.to_q.weight.grad.clone()
        return out.detach(), grad
    plain, plain_grad = run()
    model.denoiser.enable_gradient_checkpointing()
    checkpointed, checkpointed_grad = run()
    assert (checkpointed - plain).abs().max() <= 1e-6
    assert torch.allclose(checkpointed_grad, plain_grad, atol=1e-7, rtol=1e-5)


def _probe(denoiser) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    noisy = torch.randn(2, 16, 8, 8, generator=g)
    text = {"hidden": torch.randn(2, 12, 32, generator=g), "mask": torch.tensor([[1.0] * 5 + [0.0] * 7] * 2)}
    with torch.no_grad():
        return CHROMA.predict(None, denoiser, noisy, torch.tensor([300.0, 800.0]), text, {}, torch.float32)


def test_diffusers_layout_file_loads_in_chroma_pipeline_and_matches_the_trained_model(trained, tiny_models, tmp_path):
    from diffusers import ChromaPipeline
    model, state = trained
    want = _probe(model.denoiser)
    path = tmp_path / "chroma-lora.safetensors"
    save_file(CHROMA.lora_file_state(model, {"transformer": state}, 2.0, "diffusers"), str(path))
    pipe = ChromaPipeline.from_pretrained(str(tiny_models("chroma")), local_files_only=True)
    base = _probe(pipe.transformer)
    pipe.load_lora_weights(str(path))
    got = _probe(pipe.transformer)
    assert (got - base).abs().max() > 1e-2, "the LoRA did not change the output"
    assert (got - want).abs().max() <= 1e-5


def test_kohya_layout_file_merged_as_comfyui_does_equals_the_trained_model(trained, tiny_models):
    """Every default target (a single block's linear1 fused four ways, q/k/v three ways): W + alpha/rank ·
    up @ down on the original-layout weights, loaded back, gives the trained model's prediction."""
    model, state = trained
    base = load_model(str(tiny_models("chroma"))).denoiser
    config = dict(base.config)
    written = CHROMA.lora_file_state(model, {"transformer": state}, 2.0, "kohya")
    merged = merge_into_original(to_original(base.state_dict(), config), written)
    base.load_state_dict(from_original(merged, base.state_dict(), config))
    assert (_probe(base) - _probe(model.denoiser)).abs().max() <= 1e-5


def test_a_chroma_single_file_is_not_taken_for_flux(tiny_models, tmp_path):
    model = load_model(str(tiny_models("chroma")))
    path = export_transformer(model.denoiser, tmp_path / "chroma-transformer.safetensors")
    with pytest.raises(ConfigError, match=r"^model\.path: .*Chroma single file"):
        load_model(str(path))
    with pytest.raises(ConfigError, match=r"^model\.arch: "):
        load_model(str(path), arch="flux")
