"""A kohya_ss preset imported for a family kohya_ss has no key for (Krea 2, Qwen-Image 2.1, Ideogram 4):
the studio's family choice sets model.arch, kohya's flow keys map as for Flux/SD3, and each key that means
nothing for the family is left out and reported with the reason; the preset validates."""
from __future__ import annotations

import pytest

from gui.kohya_import import import_kohya, report_markdown
from gui.preset_panel import kohya_family_choices
from test_kohya_preset_shapes import FLUX_LORA


@pytest.mark.parametrize("family", ["krea2", "qwen_image21", "ideogram4"])
def test_a_flux_lora_preset_imported_for_a_new_family(family):
    shape = {**FLUX_LORA, "clip_skip": 2, "up_lr_weight": "1,1,0.5", "fp8_base": True, "t5xxl_max_token_length": 256}
    result = import_kohya(shape, family=family)
    cfg = result.config()  # validates
    assert cfg.model.arch == family
    mapped = {dotted: value for _, dotted, value in result.mapped}
    # kohya's flow keys: the timestep density, the shift, the VAE file, fp8 base, tokens per caption
    assert mapped["loss.timestep_sampling"] == "sigmoid" and mapped["loss.flow_shift"] == 3.0
    assert mapped["model.vae"] == "/m/ae.safetensors" and mapped["model.quantize"] == "float8"
    assert mapped["model.t5_max_length"] == 256 and mapped["network.rank"] == FLUX_LORA["network_dim"]
    ignored = {key: why for key, _, why in result.ignored}
    assert set(ignored) == {"flux1_checkbox", "clip_l", "t5xxl", "guidance_scale", "clip_skip", "up_lr_weight"}
    assert "Qwen3-VL" in ignored["t5xxl"] and "model.text_encoder" in ignored["clip_l"]
    assert not {"model.clip_l", "model.t5", "model.guidance", "model.clip_skip", "network.block_lr"} & set(mapped)
    assert not {k for k, _ in result.unsupported} & set(ignored)
    report = report_markdown(result)
    assert "Ignored for the chosen family (6" in report and "`guidance_scale` = `1.0`: Flux.1 dev's" in report


def test_without_a_choice_the_files_keys_decide_and_nothing_is_ignored():
    result = import_kohya(FLUX_LORA)
    assert result.config().model.arch == "flux" and result.ignored == []
    assert {d for _, d, _ in result.mapped} >= {"model.t5", "model.clip_l", "model.guidance"}


def test_the_family_choice_lists_every_registered_family():
    from trainer_backend.families.registry import FAMILY_NAMES
    values = [v for _, v in kohya_family_choices()]
    assert values[0] == "" and values[1:] == list(FAMILY_NAMES)
    assert {"krea2", "qwen_image21", "ideogram4"} <= set(values)
