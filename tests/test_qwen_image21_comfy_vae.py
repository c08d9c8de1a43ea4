"""Qwen-Image 2.1's VAE in ComfyUI's own file layout (the Wan 2.2 VAE's original names, one-frame 3-D
convolutions: what ComfyUI's VAE loader detects and builds for it) as `model.vae`: written from the tiny model,
it loads weight for weight and decodes the same, beside the transformer file or a diffusers folder; a Wan 2.1
or Wan 2.2 video VAE and a truncated file are refused in one line naming the option, the file and the key."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from trainer_backend.errors import ConfigError
from trainer_backend.families import load_model
from trainer_backend.families.qwen_image21.components import load_vae, vae_to_original

CONFIG = "sd_studio.config"


@pytest.fixture(scope="module")
def tiny(tiny_models):
    folder = tiny_models("qwen_image21")
    return folder, load_model(str(folder))


def _save(state: dict, path, config: dict | None = None) -> str:
    save_file({k: v.contiguous() for k, v in state.items()}, str(path),
              metadata={CONFIG: json.dumps(config)} if config else None)
    return str(path)


def _vae_config(vae) -> dict:
    return {k: v for k, v in vae.config.items() if not k.startswith("_")}


def _decode(vae) -> torch.Tensor:
    z = torch.randn(1, vae.config.z_dim, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return vae.decode(z).sample


def test_a_comfyui_layout_vae_file_loads_as_the_model_it_came_from(tiny, tmp_path):
    folder, model = tiny
    original = vae_to_original(model.vae.state_dict())
    assert "decoder.middle.0.residual.0.gamma" in original and original["decoder.head.2.weight"].dim() == 5
    path = _save({"first_stage_model." + k: v.to(torch.bfloat16) for k, v in original.items()},
                 tmp_path / "qwen_image_2.1_vae.safetensors", _vae_config(model.vae))
    loaded = load_vae(path)
    want = model.vae.state_dict()
    assert loaded.state_dict().keys() == want.keys()
    assert all(torch.equal(v, want[k].to(torch.bfloat16).float()) for k, v in loaded.state_dict().items())
    exact = load_vae(_save(original, tmp_path / "fp32.safetensors", _vae_config(model.vae)))
    assert torch.equal(_decode(exact), _decode(model.vae))
    # beside a diffusers folder too (model.vae replaces the folder's autoencoder)
    again = load_model(str(folder), vae=str(tmp_path / "fp32.safetensors"))
    assert torch.equal(_decode(again.vae), _decode(model.vae))


def test_other_wan_vaes_and_truncated_files_are_refused_in_one_line(tiny, tmp_path):
    _, model = tiny
    original = vae_to_original(model.vae.state_dict())
    wan21 = {"decoder.middle.0.residual.0.gamma": torch.ones(4, 1, 1, 1), "decoder.upsamples.0.residual.0.gamma":
             torch.ones(4, 1, 1, 1), "decoder.head.2.weight": torch.zeros(3, 4, 3, 3, 3)}
    with pytest.raises(ConfigError, match=r"^model.vae: wan21.safetensors is a Wan 2.1-layout VAE .* not Qwen-Image "
                                          r"2.1's: it has no decoder.upsamples.0.upsamples.0.residual.2.weight$"):
        load_vae(_save(wan21, tmp_path / "wan21.safetensors"))
    video = dict(original, **{"decoder.head.2.weight": torch.zeros(4, 8, 3, 3, 3)})
    with pytest.raises(ConfigError, match=r"^model.vae: wan22.safetensors is a Wan 2.2 video VAE "
                                          r"\(decoder.head.2.weight is \[4, 8, 3, 3, 3\], 3 frames deep\)"):
        load_vae(_save(video, tmp_path / "wan22.safetensors", _vae_config(model.vae)))
    cut = {k: v for k, v in original.items() if not k.startswith("decoder.upsamples.1.")}
    with pytest.raises(ConfigError, match=r"^model.vae: cut.safetensors is not a Qwen-Image 2.1 autoencoder: it has "
                                          r"no decoder.up_blocks.1.resnets.0.norm1.gamma$"):
        load_vae(_save(cut, tmp_path / "cut.safetensors", _vae_config(model.vae)))
