"""Options that apply to some model families or modes only say so in the schema (`when`), and the
studio shows them only there: one mechanism for family options, metadata-mode dataset options and
the [vae] / [ema] groups."""
import pytest

from trainer_backend.config import all_fields, load_config
from trainer_backend.config.applicability import applies, describe, values_of
from trainer_backend.families.registry import FAMILY_NAMES


def test_conditions_name_real_keys_and_values():
    fields = {f"{f['section']}.{f['key']}": f for f in all_fields()}
    for dotted, f in fields.items():
        for key, allowed in f["when"].items():
            assert key in fields, f"{dotted}: condition on unknown option {key}"
            choices = fields[key].get("choices")
            if choices:
                assert set(allowed) <= set(choices), f"{dotted}: {key} can never be {set(allowed) - set(choices)}"
            if key == "model.arch":  # family conditions name registered families
                assert set(allowed) <= set(FAMILY_NAMES), dotted


@pytest.mark.parametrize("overrides, shown, hidden", [
    (["model.arch=flux"], ["loss.flow_shift", "model.guidance", "ema.decay"], ["loss.min_snr_gamma", "vae.loss"]),
    (["model.arch=sdxl"], ["loss.min_snr_gamma", "network.conv_rank"], ["loss.flow_shift", "model.guidance"]),
    (["model.arch=auto"], ["loss.min_snr_gamma", "loss.flow_shift"], []),  # family not known yet: all
    (["network.type=vae"], ["vae.loss", "vae.kl_weight", "validation.every_n_steps"],
     ["ema.enabled", "network.rank", "network.dora", "samples.prompts", "loss.noise_offset"]),
    (["dataset.source=folders"], [], ["dataset.min_score", "dataset.tag_separator", "dataset.metadata_path"]),
    (["dataset.source=metadata"], ["dataset.min_score", "dataset.metadata_path"], []),
])
def test_where_options_apply(overrides, shown, hidden):
    values = values_of(load_config(None, overrides))
    when = {f"{f['section']}.{f['key']}": f["when"] for f in all_fields()}
    for key in shown:
        assert applies(when[key], values), f"{key} should apply with {overrides}"
    for key in hidden:
        assert not applies(when[key], values), f"{key} should not apply with {overrides}"
    # the distilled guidance input: Flux.1 dev and Flux.2 dev (Klein and Chroma have none)
    assert describe(when["model.guidance"]) == "only when model.arch is flux or flux2"


def test_the_form_shows_only_what_applies():
    from gui.schema_form import config_to_values, field_visibility, form_fields
    fields = form_fields()
    dotted = [f.dotted for f in fields]
    flux = field_visibility(fields, config_to_values(fields, load_config(None, ["model.arch=flux"])))
    vae = field_visibility(fields, config_to_values(fields, load_config(None, ["network.type=vae"])))
    assert flux[dotted.index("loss.flow_shift")] and not flux[dotted.index("loss.min_snr_gamma")]
    assert vae[dotted.index("vae.loss")] and not vae[dotted.index("ema.decay")]
    assert all(vae[i] for i, f in enumerate(fields) if not f.when)  # options without conditions always show


def test_the_reference_says_where_an_option_applies():
    from trainer_backend.config.reference import config_reference
    text = config_reference()
    assert "*Applies only when model.arch is flux or flux2.*" in text
    assert "*Applies only when network.type is vae.*" in text  # the [vae] section


def test_rules_about_a_section_that_does_not_apply_stay_quiet():
    """[samples] does not apply to a VAE run (nothing to sample with): scheduled samples without
    prompts are a problem for a LoRA, not for a VAE."""
    from trainer_backend.config import rules
    scheduled = ["samples.every_n_steps=5"]
    assert [p.key for p in rules.problems(load_config(None, scheduled))] == ["samples.prompts"]
    assert rules.problems(load_config(None, [*scheduled, "network.type=vae"])) == []
