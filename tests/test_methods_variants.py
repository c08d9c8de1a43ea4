"""Each LoRA variant (LoHa, LoKr, DoRA, conv adapters) trains and its output loads onto a fresh
diffusers pipeline, reproducing the trained model (rebuilt from the run's checkpoint)."""
import pytest
import torch
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import last_checkpoint, train_run, unet_probe
from trainer_backend.methods import setup_method
from trainer_backend.methods.variants import load_adapter_file
from trainer_backend.families.sd.loader import build_pipeline, load_model

VARIANTS = {
    "loha": ["network.type=loha"],
    "lokr": ["network.type=lokr", "network.lokr_factor=4"],
    "dora": ["network.dora=true"],
    "locon": ["network.conv_rank=2", "network.conv_alpha=1"],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_trains_and_loads(tmp_path, tiny_models, variant):
    model_dir = tiny_models("sd1")
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, events, cfg = train_run(tmp_path, model_dir, data, variant, "schedule.max_steps=1", "optimizer.lr=1e-2",
                                 *VARIANTS[variant])
    output = run / f"{variant}.safetensors"
    assert [e["outputs"] for e in events if e["event"] == "done"] == [[str(output)]]

    trained = load_model(str(model_dir))  # the trained model, rebuilt from the checkpoint's adapter weights
    trainable = setup_method(trained, cfg)
    trainable.load_state_dict("unet", load_file(str(last_checkpoint(run) / "adapter_unet.safetensors")))
    expected = unet_probe(trained.unet)
    base = unet_probe(load_model(str(model_dir)).unet)
    assert (expected - base).abs().max() > 1e-4, "training did not change the UNet"

    pipe = build_pipeline(load_model(str(model_dir)))
    load_adapter_file(pipe, output)
    assert (unet_probe(pipe.unet) - expected).abs().max() <= 1e-5

    log = (run / "train.log").read_text()
    keys = load_file(str(output))
    if variant == "locon":  # kohya format, conv adapters included with their own alpha
        assert "output in kohya/webui key layout" in log
        conv = [k for k in keys if "resnets_0_conv1.lora_down" in k]
        assert conv and all(keys[k].ndim == 4 for k in conv)
        assert all(keys[k.replace("lora_down.weight", "alpha")].item() == 1.0 for k in conv)
    else:
        assert "no kohya/webui key format is written" in log
        assert all(k.startswith("unet.") for k in keys)
    if variant == "dora":  # diffusers' own loader reads it too
        pipe = build_pipeline(load_model(str(model_dir)))
        pipe.load_lora_weights(str(output))
        assert (unet_probe(pipe.unet) - expected).abs().max() <= 1e-5


def test_the_run_log_names_the_layout_the_file_is_written_in():
    """A Flux/Krea 2/Wan LoRA written in diffusers' or the original layout was logged as "kohya/webui format"."""
    from trainer_backend.config import load_config
    from trainer_backend.methods.variants import format_note
    cfg = load_config(None, [])
    assert "diffusers' key layout" in format_note(cfg, "diffusers") and "kohya" not in format_note(cfg, "diffusers")
    assert "original model's key layout" in format_note(cfg, "original")
    assert "kohya/webui key layout" in format_note(cfg, "kohya")
