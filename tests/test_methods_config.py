"""Method, EMA, DreamBooth and sample options that cannot work are refused before a run starts,
with the key named; the new sections show up where the GUI looks for them."""
import pytest

from conftest import make_dataset
from trainer_backend.config import ConfigError, field_info, load_config
from trainer_backend.config.checks import validate_for_run


@pytest.mark.parametrize("overrides, message", [
    (["network.type=loha", "network.dora=true"], "network.dora: DoRA is a LoRA option"),
    (["network.type=full", "network.conv_rank=4"], "network.conv_rank:"),
    (["ema.enabled=true", "hardware.strategy=fsdp"], "ema.enabled:"),
    (["dataset.num_class_images=5"], "dataset.class_prompt: required to generate class images"),
    (["samples.every_n_steps=5"], "samples.prompts: no prompts, but sampling is scheduled"),
    (['samples.prompts="ok\\nbad --w x"'], "samples.prompts: line 2: --w needs a number"),
    (["samples.prompt_file=/nonexistent/prompts.txt"], "samples.prompt_file: cannot read"),
])
def test_bad_method_options_name_the_key(tmp_path, overrides, message):
    data = make_dataset(tmp_path / "data", n=1, size=32)
    cfg = load_config(None, ["model.path=builtin:tiny-sd1", f"dataset.path={data}", *overrides])
    with pytest.raises(ConfigError, match=message):
        validate_for_run(cfg)


def test_class_images_present_need_no_prompt(tmp_path):
    data = make_dataset(tmp_path / "data", n=1, size=32)
    classes = make_dataset(tmp_path / "class", n=2, size=32)
    validate_for_run(load_config(None, ["model.path=builtin:tiny-sd1", f"dataset.path={data}",
                                        f"dataset.class_path={classes}", "dataset.num_class_images=2"]))


def test_sections_and_stable_keys():
    assert field_info("samples", "prompts")["tab"] == "Samples"
    assert field_info("samples", "prompts")["ui"]["widget"] == "textarea"  # prompts contain commas
    assert {"lora", "loha", "lokr", "full"} <= set(field_info("network", "type")["choices"])
    from trainer_backend.families.sd.loader import SAMPLERS
    assert set(field_info("samples", "scheduler")["choices"]) == {*SAMPLERS, "default"}
