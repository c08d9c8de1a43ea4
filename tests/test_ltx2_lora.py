"""LTX-2 LoRA files: ComfyUI's layout on the FULL-SIZE transformer (meta device), video-only and with
the audio stream, reads back through diffusers' own LTX-2 converter onto exactly the adapted modules."""
from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from trainer_backend.families.ltx2.lora_keys import meta_transformer, original_name, targets, to_comfy_lora


@pytest.mark.parametrize("audio", [False, True])
def test_full_size_comfy_keys_all_load_in_diffusers(audio):
    from diffusers import LTX2Pipeline
    denoiser = meta_transformer()
    denoiser.add_adapter(LoraConfig(r=1, lora_alpha=1, target_modules=targets(audio)))
    adapted = {n for n, m in denoiser.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    layers = denoiser.config.num_layers
    assert len(adapted) == layers * (10 + (18 if audio else 0))
    assert audio == any("audio" in n for n in adapted)
    state = {k: torch.zeros(v.shape) for k, v in get_peft_model_state_dict(denoiser).items()}
    written = to_comfy_lora({"transformer": state}, 1.0)
    assert all(k.startswith("diffusion_model.transformer_blocks.") for k in written)
    converted = LTX2Pipeline.lora_state_dict(written)
    assert all("lora" in k for k in converted)  # nothing diffusers' loader would refuse (an .alpha key)
    loaded = {k.removeprefix("transformer.").rsplit(".lora_", 1)[0] for k in converted}
    assert loaded == adapted, (sorted(adapted - loaded)[:5], sorted(loaded - adapted)[:5])


def test_renamed_modules_get_their_original_names():
    assert original_name("proj_in") == "patchify_proj"
    assert original_name("transformer_blocks.3.attn1.to_q") == "transformer_blocks.3.attn1.to_q"


def test_tiny_ltx2_lora_in_comfy_layout_loads_and_changes_the_video(tmp_path):
    from diffusers import LTX2Pipeline
    from safetensors.torch import save_file

    from trainer_backend.families.ltx2.tiny import build_tiny_ltx2
    folder = build_tiny_ltx2(tmp_path / "tiny-ltx2")

    def video(pipe):
        out = pipe("a red square", negative_prompt="", num_frames=9, height=32, width=32, num_inference_steps=2,
                   guidance_scale=1.0, frame_rate=25.0, max_sequence_length=16, output_type="np",
                   generator=torch.Generator().manual_seed(0))
        assert out.audio is not None  # the audio stream runs beside the video
        return out.frames[0]

    trained = LTX2Pipeline.from_pretrained(folder)
    before = video(trained)
    assert before.shape == (9, 32, 32, 3)
    trained.transformer.add_adapter(LoraConfig(r=2, lora_alpha=4, target_modules=targets(audio=False)))
    torch.manual_seed(1)
    for name, p in trained.transformer.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    with_lora = video(trained)
    assert abs(with_lora - before).max() > 1e-3
    save_file(to_comfy_lora({"transformer": get_peft_model_state_dict(trained.transformer)}, 4.0),  # alpha/rank = 2, folded
              tmp_path / "comfy.safetensors")
    pipe = LTX2Pipeline.from_pretrained(folder)
    pipe.load_lora_weights(str(tmp_path / "comfy.safetensors"))
    assert abs(video(pipe) - with_lora).max() < 1e-4
