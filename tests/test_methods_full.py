"""Full fine-tuning on SD1 (with the text encoder), SD2 (v-prediction) and SDXL: the diffusers folder and the
single-file checkpoint both load, hold the same trained weights, and differ from the base
where training happened (frozen parts keep the base weights)."""
import pytest
import torch
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.families.sd.loader import load_model


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return max((sa[k].float() - sb[k].float()).abs().max().item() for k in sa)


def _fp16(module: torch.nn.Module) -> torch.nn.Module:
    return module.to(torch.float16)


# frozen text encoders under bf16, for every family, are in tests/test_family_conformance.py
@pytest.mark.parametrize("arch, train_te, mixed", [("sd1", True, "no")])
def test_full_finetune_outputs_load_and_differ(tmp_path, tiny_models, arch, train_te, mixed):
    """SDXL trains in bf16 mixed precision: its frozen text encoders are bf16 during training, and
    the outputs must still carry the original weights, not bf16-rounded copies."""
    import diffusers
    model_dir = tiny_models(arch)
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, events, _ = train_run(tmp_path, model_dir, data, "ft", "network.type=full", "schedule.max_steps=2",
                               "optimizer.lr=1e-3", f"network.train_text_encoder={str(train_te).lower()}", f"precision.mixed={mixed}")
    folder, single = run / "ft-diffusers", run / "ft.safetensors"
    assert [e["outputs"] for e in events if e["event"] == "done"] == [[str(single), str(folder)]]
    assert (run / "checkpoints" / "step-00000002" / "full_unet.safetensors").is_file()

    cls = diffusers.StableDiffusionXLPipeline if arch == "sdxl" else diffusers.StableDiffusionPipeline
    pipe = cls.from_pretrained(str(folder), local_files_only=True)  # plain diffusers
    stored = load_file(str(folder / "unet" / "diffusion_pytorch_model.safetensors"))
    assert {v.dtype for v in stored.values()} == {torch.float16}  # network.save_precision = fp16
    from_file = load_model(str(single))  # diffusers' from_single_file (configs embedded in the file)
    base = load_model(str(model_dir))

    assert _max_diff(pipe.unet, from_file.unet) == 0.0
    assert _max_diff(pipe.unet, _fp16(base.unet)) > 1e-4, "the UNet did not change"
    assert _max_diff(pipe.vae, _fp16(base.vae)) == 0.0  # frozen: the base weights
    encoders = [pipe.text_encoder] + ([pipe.text_encoder_2] if arch == "sdxl" else [])
    for saved, loaded, original in zip(encoders, from_file.text_encoders, base.text_encoders):
        assert _max_diff(saved, loaded) == 0.0
        moved = _max_diff(saved, _fp16(original))
        assert (moved > 1e-4) if train_te else (moved == 0.0)


def test_full_finetune_keeps_fp32_master_weights(tiny_models):
    """Under bf16 mixed precision a full fine-tune's UNet and trained text encoder start from the
    exact fp32 weights (no bf16 round trip); frozen encoders go to bf16."""
    from types import SimpleNamespace
    from trainer_backend.config import load_config
    from trainer_backend.methods import setup_method
    from trainer_backend.training.setup import place_model
    model_dir = tiny_models("sdxl")
    cfg = load_config(None, [f"model.path={model_dir}", "network.type=full", "precision.mixed=bf16",
                             "network.train_text_encoder=false"])
    model, base = load_model(str(model_dir)), load_model(str(model_dir))
    place_model(model, cfg, SimpleNamespace(device=torch.device("cpu")))
    trainable = setup_method(model, cfg)
    assert {p.dtype for p in trainable.parameters()} == {torch.float32}
    assert _max_diff(model.unet, base.unet) == 0.0
    assert all(te.dtype == torch.bfloat16 for te in model.text_encoders)
    assert all(not p.requires_grad for te in model.text_encoders for p in te.parameters())
