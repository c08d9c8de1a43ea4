"""LoRA files other tools read (issue 29 items 16 and 18), checked on the full-size architectures built
on the meta device (no weights), as the conformance suite does.

16: Flux.1's CLIP-L adapters in the default (diffusers) layout carry transformers 4's `text_model.`
(transformers 5 flattened CLIPTextModel): ComfyUI's CLIP key map knows only those names (all 96 keys were
dropped), and diffusers with transformers 4 failed the whole load without them.
18: the metadata kohya's sd-scripts and musubi-tuner write and SwarmUI classifies by:
ss_base_model_version, ss_network_module and the SAI model spec (sai_model_spec, architecture,
implementation, title, resolution, date)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from trainer_backend.config import load_config
from trainer_backend.families import get_family
from trainer_backend.families.component_files import bundled
from trainer_backend.methods.kohya_format import kohya_metadata

FLUX, SD3, FLUX2, ZIMAGE = (get_family(n) for n in ("flux", "sd3", "flux2", "zimage"))
# the names ComfyUI's CLIP-L key map (comfy/lora.py, model_lora_keys_clip) expects under `text_encoder.`:
# transformers 4's CLIPTextModel paths, for each of the 12 layers
CLIP_L_MODULES = {f"text_model.encoder.layers.{i}.{part}" for i in range(12)
                  for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj")}


def test_flux_clip_l_adapters_carry_text_model_in_the_diffusers_layout():
    from transformers import CLIPTextConfig, CLIPTextModel
    with torch.device("meta"):
        clip_l = CLIPTextModel(CLIPTextConfig(**bundled("flux", "text_encoder/config.json")))
    assert not hasattr(clip_l, "text_model")  # transformers 5's flattened CLIPTextModel
    clip_l.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"]))
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(clip_l).items()}
    model = SimpleNamespace(family=FLUX, components=lambda: {"transformer": None, "text_encoder": clip_l})
    written = FLUX.lora_file_state(model, {"text_encoder": state}, 1.0, "diffusers")
    assert len(written) == 96
    modules = {k[len("text_encoder."):].rsplit(".lora_", 1)[0] for k in written}
    assert modules == CLIP_L_MODULES
    # our own reader (network.network_weights) puts them back on the flattened model's modules
    from trainer_backend.families.lora_files import read_diffusers_layout
    back = read_diffusers_layout(written, {"text_encoder": clip_l})
    assert {m for (_, m) in back.scales} == {m.removeprefix("text_model.") for m in CLIP_L_MODULES}
    assert all(clip_l.get_submodule(m) is not None for (_, m) in back.scales)


def test_sd3_clip_adapters_keep_their_own_text_model_once():
    """SD3's CLIPs are CLIPTextModelWithProjection, which keeps `text_model.` in transformers 5: not doubled."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection
    with torch.device("meta"):
        clip_g = CLIPTextModelWithProjection(CLIPTextConfig(**bundled("sd3", "text_encoder_2/config.json")))
    clip_g.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=["q_proj"]))
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(clip_g).items()}
    model = SimpleNamespace(family=SD3, components=lambda: {"transformer": None, "text_encoder_2": clip_g})
    written = SD3.lora_file_state(model, {"text_encoder_2": state}, 1.0, "diffusers")
    assert written and all(k.startswith("text_encoder_2.text_model.encoder.layers.") for k in written)


def _stub(family, denoiser_config: dict | None = None, denoiser=None, encoder=None, prediction="flow"):
    denoiser = denoiser if denoiser is not None else SimpleNamespace(config=SimpleNamespace(**denoiser_config))
    return SimpleNamespace(family=family, denoiser=denoiser, text_encoders=[encoder], prediction_type=prediction)


def _sd3(variant: str):
    from diffusers import SD3Transformer2DModel
    with torch.device("meta"):
        return SD3Transformer2DModel.from_config(bundled("sd3", f"{variant}/config.json"))


def _encoder(name: str):
    """A text encoder of the named class on the meta device (Flux.2 tells Klein from dev by it)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, Qwen3Config, Qwen3ForCausalLM
    from trainer_backend.families.flux2.components import bundled as flux2_bundled
    with torch.device("meta"):
        if name == "mistral":
            return Mistral3ForConditionalGeneration(Mistral3Config(**flux2_bundled("text_encoder-mistral-small-3.json")))
        return Qwen3ForCausalLM(Qwen3Config(**flux2_bundled(f"text_encoder-{name}.json")))


CASES = {  # family, model factory -> (ss_base_model_version, ss_network_module, modelspec.architecture)
    "sd3-medium": (SD3, lambda: _stub(SD3, denoiser=_sd3("transformer_sd3_medium")),
                   ("medium", "networks.lora_sd3", "stable-diffusion-3-medium/lora")),
    "sd3.5-medium": (SD3, lambda: _stub(SD3, denoiser=_sd3("transformer")),
                     ("5-medium", "networks.lora_sd3", "stable-diffusion-3-5-medium/lora")),
    "sd3.5-large": (SD3, lambda: _stub(SD3, denoiser=_sd3("transformer_large")),
                    ("5-large", "networks.lora_sd3", "stable-diffusion-3-5-large/lora")),
    "flux-dev": (FLUX, lambda: _stub(FLUX, bundled("flux", "transformer/config.json")),
                 ("flux1", "networks.lora_flux", "flux-1-dev/lora")),
    "flux2-klein-4b": (FLUX2, lambda: _stub(FLUX2, bundled("flux2", "transformer-klein-4b.json"), encoder=_encoder("qwen3-4b")),
                       ("flux_2_klein_4b", "networks.lora_flux_2", "flux.2-klein-4b/lora")),
    "flux2-klein-9b": (FLUX2, lambda: _stub(FLUX2, bundled("flux2", "transformer-klein-9b.json"), encoder=_encoder("qwen3-8b")),
                       ("flux_2_klein_9b", "networks.lora_flux_2", "flux.2-klein-9b/lora")),
    "flux2-dev": (FLUX2, lambda: _stub(FLUX2, bundled("flux2", "transformer-dev.json"), encoder=_encoder("mistral")),
                  ("flux_2_dev", "networks.lora_flux_2", "flux.2-dev/lora")),
    "zimage": (ZIMAGE, lambda: _stub(ZIMAGE, {}), ("z_image", "networks.lora_zimage", "z-image/lora")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_metadata_names_the_variant_as_kohya_musubi_and_swarmui_do(case):
    family, make, (version, module, architecture) = CASES[case]
    cfg = load_config(None, ["output.name=my-style", "dataset.resolution=1024"])
    meta = kohya_metadata(cfg, family, steps=10, epochs=1, num_images=4, started_at=1795840000.0, model=make())
    assert (meta["ss_base_model_version"], meta["ss_network_module"], meta["modelspec.architecture"]) == \
        (version, module, architecture)
    assert meta["modelspec.sai_model_spec"] == "1.0.1" and meta["modelspec.title"] == "my-style"
    assert meta["modelspec.implementation"] == family.modelspec_implementation != ""
    assert meta["modelspec.resolution"] == "1024x1024" and meta["modelspec.date"].startswith("2026-11-")
    assert "modelspec.prediction_type" not in meta   # flow matching: none, as kohya writes for Flux


def test_sd_families_keep_their_names_and_state_the_prediction_type():
    sd1, sdxl = get_family("sd1"), get_family("sdxl")
    cfg = load_config(None, ["output.name=x"])
    meta = kohya_metadata(cfg, sdxl, steps=1, epochs=1, num_images=1,
                          model=_stub(sdxl, {}, prediction="epsilon"))
    assert meta["ss_base_model_version"] == "sdxl_base_v1-0" and meta["ss_network_module"] == "networks.lora"
    assert meta["modelspec.implementation"] == "https://github.com/Stability-AI/generative-models"
    assert meta["modelspec.prediction_type"] == "epsilon"
    meta = kohya_metadata(load_config(None, ["model.clip_skip=2"]), sd1, steps=1, epochs=1, num_images=1,
                          model=_stub(sd1, {}, prediction="v_prediction"))
    assert meta["modelspec.implementation"] == "diffusers" and meta["modelspec.prediction_type"] == "v"
    assert meta["modelspec.encoder_layer"] == "2" and meta["ss_clip_skip"] == "2"
