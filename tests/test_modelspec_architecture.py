"""modelspec.architecture names the variant a file was trained on, as kohya's sd-scripts
(`library/sai_model_spec.py`, `sd3_utils.analyze_state_dict_state`) name them: `stable-diffusion-3-medium`,
`stable-diffusion-3-5-medium`, `stable-diffusion-3-5-large`, `flux-1-dev`, `flux-1-schnell`; LoRA files
add `/lora`, full files carry the name as is. Decided from the transformer's config, checked here on
the full-size architectures built on the meta device (no weights)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trainer_backend.families import get_family
from trainer_backend.families.component_files import bundled

SD3, FLUX = get_family("sd3"), get_family("flux")


def _meta(model_class, config: dict) -> SimpleNamespace:
    with torch.device("meta"):
        return SimpleNamespace(denoiser=model_class.from_config(config))


@pytest.mark.parametrize("variant,architecture", [("transformer_sd3_medium", "stable-diffusion-3-medium"),
                                                  ("transformer", "stable-diffusion-3-5-medium"),
                                                  ("transformer_large", "stable-diffusion-3-5-large")])
def test_sd3_variants_get_their_own_architecture(variant, architecture):
    from diffusers import SD3Transformer2DModel
    model = _meta(SD3Transformer2DModel, bundled("sd3", f"{variant}/config.json"))
    assert SD3.architecture(model) == architecture


def test_the_two_mediums_have_the_same_depth_so_the_blocks_decide():
    """SD3 Medium and SD3.5 Medium both have 24 joint blocks: the layer count alone cannot tell them
    apart; SD3.5 Medium's dual-attention blocks and q/k norm do. Large has 38 blocks, q/k norm, no dual."""
    medium, medium_35, large = (bundled("sd3", f"{v}/config.json")
                                for v in ("transformer_sd3_medium", "transformer", "transformer_large"))
    assert medium["num_layers"] == medium_35["num_layers"] == 24 and large["num_layers"] == 38
    assert not medium["qk_norm"] and medium_35["dual_attention_layers"] and not large["dual_attention_layers"]


@pytest.mark.parametrize("guidance,architecture", [(True, "flux-1-dev"), (False, "flux-1-schnell")])
def test_flux_dev_and_schnell_are_told_apart_by_the_guidance_embedding(guidance, architecture):
    from diffusers import FluxTransformer2DModel
    config = {**bundled("flux", "transformer/config.json"), "guidance_embeds": guidance}
    assert FLUX.architecture(_meta(FluxTransformer2DModel, config)) == architecture


def test_lora_metadata_gets_the_variant_and_the_adapter_suffix():
    from diffusers import SD3Transformer2DModel
    from trainer_backend.config import load_config
    from trainer_backend.methods.kohya_format import kohya_metadata
    cfg = load_config(None, ["model.path=/models/sd3.5_large.safetensors"])
    model = _meta(SD3Transformer2DModel, bundled("sd3", "transformer_large/config.json"))
    meta = kohya_metadata(cfg, SD3, steps=1, epochs=1, num_images=1, model=model)
    assert meta["modelspec.architecture"] == "stable-diffusion-3-5-large/lora"
    assert kohya_metadata(cfg, SD3, steps=1, epochs=1, num_images=1)["modelspec.architecture"] == \
        "stable-diffusion-3/lora"  # the model unknown: the family's name
