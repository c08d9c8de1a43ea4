"""Flux.2 Klein and dev: both LoRA layouts on the full-size Klein 4B, 9B and dev (32B) architectures (meta
device) land on exactly the trained modules through diffusers' own converters, with the trained update;
a tiny run's file in each layout loads in a plain diffusers Flux2KleinPipeline / Flux2Pipeline, changes
the image, and gives the trained transformer back within 1e-5; text, latents and reference images go in
as the pipelines put them."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import last_checkpoint, train_run
from trainer_backend.families import get_family, load_model
from trainer_backend.families.flux2.kohya_lora import merge_into_original
from trainer_backend.families.flux2.original_keys import from_original, to_original
from trainer_backend.methods import setup_method

FLUX2 = get_family("flux2")


def _random_lora(module, targets, rank, seed=0, alpha=1.0):
    module.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets))
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * 0.1 for k, v in get_peft_model_state_dict(module).items()}


class _Meta:
    def __init__(self, denoiser):
        self.family, self.denoiser = FLUX2, denoiser


@pytest.mark.parametrize("size,blocks", [("klein-4b", (5, 20)), ("klein-9b", (8, 24)), ("dev", (8, 48))])
@pytest.mark.parametrize("layout", ["kohya", "diffusers"])
def test_full_size_lora_layouts_land_on_the_trained_modules_with_the_trained_update(size, blocks, layout):
    denoiser = FLUX2.meta_denoiser(size)
    assert (denoiser.config.num_layers, denoiser.config.num_single_layers) == blocks
    original = to_original(denoiser.state_dict(), dict(denoiser.config))
    # every weight has its place in the original layout, none twice (q, k and v fused into one)
    assert sum(v.numel() for v in original.values()) == sum(v.numel() for v in denoiser.state_dict().values())
    state = _random_lora(denoiser, list(FLUX2.default_targets), rank=3, alpha=2.0)
    adapted = {k[: -len(".lora_A.weight")] for k in state if k.endswith("lora_A.weight")}
    written = FLUX2.lora_file_state(_Meta(denoiser), {"transformer": state}, 2.0, layout)
    if layout == "kohya":  # ComfyUI's key map: lora_unet_<original module with _>, shapes fitting that weight
        by_name = {k[: -len(".weight")].replace(".", "_"): v.shape for k, v in original.items() if v.dim() == 2}
        names = {k.split(".")[0] for k in written}
        for n in names:
            shape = by_name[n[len("lora_unet_"):]]
            assert written[f"{n}.lora_up.weight"].shape[0] == shape[0]
            assert written[f"{n}.lora_down.weight"].shape[1] == shape[1]
        assert len(names) == blocks[0] * 4 + blocks[1]  # img/txt qkv (fused) and proj; one linear1 per single
    assert FLUX2.diffusers_lora_targets(written, denoiser) == adapted
    converted = FLUX2.pipeline_class().lora_state_dict(dict(written))
    converted = converted[0] if isinstance(converted, tuple) else converted
    g = torch.Generator().manual_seed(1)
    for module in sorted(adapted)[::7]:
        a, b = state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"]
        ca, cb = converted[f"transformer.{module}.lora_A.weight"], converted[f"transformer.{module}.lora_B.weight"]
        x = torch.randn(a.shape[1], 2, generator=g)
        want = (2.0 / a.shape[0]) * (b @ (a @ x))  # alpha / rank
        assert (cb @ (ca @ x) - want).abs().max() <= 1e-5 * want.abs().max(), module


def test_kohya_file_merged_like_comfyui_equals_peft_merge(tiny_models):
    model = load_model(str(tiny_models("flux2")))
    base = {k: v.clone() for k, v in model.denoiser.state_dict().items()}
    config = dict(model.denoiser.config)
    state = _random_lora(model.denoiser, list(FLUX2.default_targets), rank=3, seed=2, alpha=5.0)
    model.denoiser.load_state_dict({k.replace("lora_A.", "lora_A.default.").replace("lora_B.", "lora_B.default."): v
                                    for k, v in state.items()}, strict=False)
    merged = merge_into_original(to_original(base, config), FLUX2.lora_file_state(model, {"transformer": state},
                                                                                  5.0, "kohya"))
    model.denoiser.fuse_lora(lora_scale=1.0)
    model.denoiser.unload_lora()
    trained = model.denoiser.state_dict()
    back = from_original(merged, trained, config)
    assert back.keys() == trained.keys()
    assert max((back[k] - trained[k]).abs().max().item() for k in trained) < 1e-5
    assert max((trained[k] - base[k]).abs().max().item() for k in trained) > 1e-2, "the adapters changed nothing"


def _probe(transformer, control: bool = False):
    g = torch.Generator().manual_seed(3)
    c = transformer.config
    guidance = torch.tensor([1.0, 3.5]) if c.guidance_embeds else None  # dev's distilled guidance
    n = 32 if control else 16
    ids = torch.cartesian_prod(torch.tensor([0]), torch.arange(4), torch.arange(4), torch.tensor([0]))
    if control:
        ids = torch.cat([ids, ids + torch.tensor([10, 0, 0, 0])])
    txt = torch.cartesian_prod(torch.tensor([0]), torch.tensor([0]), torch.tensor([0]), torch.arange(5))
    with torch.no_grad():
        return transformer(hidden_states=torch.randn(2, n, c.in_channels, generator=g),
                           encoder_hidden_states=torch.randn(2, 5, c.joint_attention_dim, generator=g),
                           timestep=torch.tensor([0.2, 0.9]), img_ids=ids, txt_ids=txt, guidance=guidance,
                           return_dict=False)[0]


@pytest.mark.parametrize("layout", ["kohya", "diffusers"])
@pytest.mark.parametrize("arch,pipeline", [("flux2", "Flux2KleinPipeline"), ("flux2-dev", "Flux2Pipeline")])
def test_tiny_lora_loads_in_diffusers_changes_the_image_and_is_the_trained_model(tmp_path, tiny_models, layout,
                                                                                arch, pipeline):
    import diffusers
    model_dir = tiny_models(arch)
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, _, cfg = train_run(tmp_path, model_dir, data, layout, f"output.lora_format={layout}", "schedule.max_steps=2",
                            "optimizer.lr=5e-2", "checkpoints.every_n_steps=2",
                            f"network.target_modules={json.dumps(list(FLUX2.default_targets))}")
    out = run / f"{layout}.safetensors"
    with safe_open(str(out), "pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    # musubi-tuner's and SwarmUI's names; a tiny Klein counts as 4B
    assert meta["ss_base_model_version"] == ("flux_2_dev" if arch == "flux2-dev" else "flux_2_klein_4b")
    assert meta["modelspec.architecture"] == ("flux.2-dev/lora" if arch == "flux2-dev" else "flux.2-klein-4b/lora")
    assert ("lora_unet_double_blocks_0_img_attn_qkv.alpha" in keys) == (layout == "kohya")
    assert ("lora_unet_single_blocks_0_linear1.lora_up.weight" in keys) == (layout == "kohya")
    assert ("transformer.single_transformer_blocks.0.attn.to_qkv_mlp_proj.lora_A.weight" in keys) == \
        (layout == "diffusers")

    trained = load_model(str(model_dir))  # the trained transformer, from the checkpoint's adapter weights
    setup_method(trained, cfg).load_state_dict(
        "transformer", load_file(str(last_checkpoint(run) / "adapter_transformer.safetensors")))
    base = _probe(load_model(str(model_dir)).denoiser)
    assert (_probe(trained.denoiser) - base).abs().max() > 1e-4, "training did not change the transformer"

    pipe = getattr(diffusers, pipeline).from_pretrained(str(model_dir), local_files_only=True)  # plain diffusers
    pipe.set_progress_bar_config(disable=True)

    def image():
        return torch.from_numpy(pipe(prompt="a red square", num_inference_steps=2, height=32, width=32,
                                     max_sequence_length=pipe.tokenizer.model_max_length,
                                     generator=torch.Generator().manual_seed(0), output_type="np").images[0])
    before = image()
    pipe.load_lora_weights(str(out))
    assert (image() - before).abs().max() > 1e-3, "the LoRA did not change the image"
    for control in (False, True):
        assert (_probe(pipe.transformer, control) - _probe(trained.denoiser, control)).abs().max() <= 1e-5


@pytest.mark.parametrize("arch,pipeline", [("flux2", "Flux2KleinPipeline"), ("flux2-dev", "Flux2Pipeline")])
def test_text_latents_and_reference_tokens_are_the_pipelines(tiny_models, arch, pipeline):
    """The family's conditioning equals the model's pipeline's own (prompt embeddings: Klein's Qwen3
    layers, dev's Mistral layers 10/20/30 after the system message; the VAE latents with their
    batch-norm normalisation), and a reference image's tokens change the prediction of the image's."""
    model = load_model(str(tiny_models(arch)))
    pipe = FLUX2.build_pipeline(model)
    assert type(pipe).__name__ == pipeline
    captions = ["a red square", "a blue circle on a plain background [IMG]"]
    tokens = FLUX2.tokenize(model, captions, 0)
    assert tokens[1].sum(1).max() < tokens[1].shape[1], "the caption was cut off: nothing left to compare"
    text = FLUX2.encode_text(model, tokens)["hidden"]
    embeds, _ = pipe.encode_prompt(captions, device="cpu", **FLUX2.pipeline_call_options(model))
    assert text.shape == embeds.shape and (text - embeds).abs().max() <= 1e-6
    pixels = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents = FLUX2.encode_latents(model, pixels, None)
    assert latents.shape == (2, *FLUX2.latent_shape(model, 32, 32))
    assert torch.allclose(latents, pipe._encode_vae_image(pixels, None), atol=1e-6)

    noisy = torch.randn(latents.shape, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([300.0, 700.0])
    plain = FLUX2.predict(model, model.denoiser, noisy, t, {"hidden": text}, {}, torch.float32)
    with_ref = FLUX2.predict(model, model.denoiser, noisy, t, {"hidden": text}, {"control_latents": latents},
                             torch.float32)
    assert plain.shape == noisy.shape and (plain - with_ref).abs().max() > 1e-4
    guided = FLUX2.predict(model, model.denoiser, noisy, t, {"hidden": text}, {}, torch.float32,
                           cfg=SimpleNamespace(model=SimpleNamespace(guidance=4.0)))  # model.guidance
    assert ((guided - plain).abs().max() > 1e-4) == (arch == "flux2-dev"), "only dev takes the guidance value"
    FLUX2.use_plain_attention(model)  # precision.attention = "default": the math kernel, the same numbers
    again = FLUX2.predict(model, model.denoiser, noisy, t, {"hidden": text}, {}, torch.float32)
    assert (again - plain).abs().max() <= 1e-5


def test_the_posterior_noise_lands_on_its_own_patchified_latent(tiny_models):
    """Uncached latents draw the VAE posterior's noise in the patchified shape: zero noise is exactly the
    cached (posterior-mean) latent, and noise at one patchified position moves that position only, so the
    patchify order of the noise and of the latents agree."""
    model = load_model(str(tiny_models("flux2")))
    pixels = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(4)) * 2 - 1
    shape = (1, *FLUX2.latent_shape(model, 32, 32))
    mean = FLUX2.encode_latents(model, pixels, None)
    assert torch.equal(FLUX2.encode_latents(model, pixels, torch.zeros(shape)), mean)
    eps = torch.zeros(shape)
    eps[0, 13, 2, 3] = 1.0
    moved = (FLUX2.encode_latents(model, pixels, eps) - mean).abs() > 0
    assert moved.sum() == 1 and moved[0, 13, 2, 3]


def test_a_paired_run_trains_on_reference_images_and_samples_with_and_without_one(tmp_path, tiny_models):
    from test_data_pairs import paired_folder
    images, controls = paired_folder(tmp_path, sizes=((64, 64), (64, 64)))  # the pipeline takes >= 64 px
    reference = next(controls.iterdir())
    prompts = f"a red square --control {reference} --w 32 --h 32 --s 2\\na blue circle --w 32 --h 32 --s 2"
    run, events, _ = train_run(tmp_path, tiny_models("flux2"), images, "paired", f"dataset.control_path={controls}",
                               "schedule.max_steps=2", "optimizer.lr=1e-2", f"samples.prompts=\"{prompts}\"",
                               "samples.every_n_steps=2")
    steps = [e for e in events if e["event"] == "step"]
    assert len(steps) == 2 and all(e["loss"] == e["loss"] for e in steps)  # finite
    (sample,) = [e for e in events if e["event"] == "sample"]
    assert len(sample["paths"]) == 2 and all((run / "samples").joinpath(p).is_file() for p in sample["paths"])
    assert (run / "paired.safetensors").is_file()


def test_a_target_the_kohya_layout_cannot_hold_is_refused_before_training(tiny_models):
    from trainer_backend.config import ConfigError, load_config
    model = load_model(str(tiny_models("flux2")))
    cfg = load_config(None, [f"model.path={tiny_models('flux2')}", "network.target_modules=[\"to_q\", "
                             "\"double_stream_modulation_img.linear\"]"])
    with pytest.raises(ConfigError, match=r"^network\.target_modules: 'double_stream_modulation_img\.linear' has "
                                          r"no counterpart in kohya's Flux\.2 LoRA layout \(use output\.lora_format"):
        setup_method(model, cfg)
    model = load_model(str(tiny_models("flux2")))
    diffusers = load_config(None, [f"model.path={tiny_models('flux2')}", "output.lora_format=diffusers",
                                   "network.target_modules=[\"to_q\", \"double_stream_modulation_img.linear\"]"])
    assert "transformer" in setup_method(model, diffusers).modules  # diffusers' layout holds any module


def test_a_dev_folder_with_its_pixtral_processor_loads_without_torchvision(tmp_path, tiny_models):
    """FLUX.2-dev's tokenizer slot is a PixtralProcessor (transformers builds none without torchvision):
    the folder loads with the tokenizer inside it and the chat template the processor keeps, and the
    text encoding is the one the tiny model's own tokenizer gives."""
    folder = tmp_path / "FLUX.2-dev"
    shutil.copytree(tiny_models("flux2-dev"), folder)
    index = json.loads((folder / "model_index.json").read_text())
    index["tokenizer"] = ["transformers", "PixtralProcessor"]
    (folder / "model_index.json").write_text(json.dumps(index))
    tok = folder / "tokenizer"
    template = (tok / "chat_template.jinja").read_text()
    (tok / "chat_template.jinja").unlink()  # as processors saved it before: in chat_template.json
    (tok / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    (tok / "processor_config.json").write_text(json.dumps({"processor_class": "PixtralProcessor", "patch_size": 14,
                                                           "spatial_merge_size": 2}))
    loaded = load_model(str(folder))
    assert loaded.tokenizers[0].chat_template == template
    own = load_model(str(tiny_models("flux2-dev")))
    captions = ["a red square"]
    for a, b in zip(FLUX2.tokenize(loaded, captions, 0), FLUX2.tokenize(own, captions, 0)):
        assert torch.equal(a, b)


def test_builtin_tiny_flux2_dev_is_a_flux2_model_to_the_plan_and_the_loader():
    from trainer_backend.__main__ import _plan_arch
    from trainer_backend.config import load_config
    from trainer_backend.families.builtin import BUILTIN_MODELS
    assert BUILTIN_MODELS["tiny-flux2-dev"] == "flux2" and BUILTIN_MODELS["tiny-flux2"] == "flux2"
    assert _plan_arch(load_config(None, ["model.path=builtin:tiny-flux2-dev"])) == "flux2"


@pytest.mark.parametrize("arch", ["flux2", "flux2-dev"])
def test_training_samples_decode_as_the_pipeline_itself_does(tiny_models, arch):
    """diffusion/sampling.generate (denoise to latents, decode with the fp32 VAE) gives the image the plain
    pipeline gives; dev's pipeline returns packed tokens as its latent output (this failed at the VAE:
    'expected input[1, 1, 64, 32] to have 8 channels')."""
    import numpy as np
    from trainer_backend.diffusion.sampling import generate
    model = load_model(str(tiny_models(arch)))
    pipe = FLUX2.build_pipeline(model)
    call = dict(**FLUX2.prompt_arguments(model, "a red square", None), width=64, height=48, num_inference_steps=2,
                **FLUX2.guidance_arguments(model, 4.0), **FLUX2.pipeline_call_options(model))
    with torch.no_grad():
        (ours,) = generate(pipe, torch.device("cpu"), torch.float32, generator=torch.Generator().manual_seed(3), **call)
        (theirs,) = pipe(generator=torch.Generator().manual_seed(3), **call).images
    assert ours.size == theirs.size == (64, 48)
    assert np.abs(np.asarray(ours, dtype=float) - np.asarray(theirs, dtype=float)).max() <= 1
