"""A weight relabelled F32 -> I32 (BF16/F16 -> I16: the same bytes, so the header still adds up) in
any model file is refused with one line naming the option, the file and the tensor, instead of
training on garbage and exiting 0 (issue 37 item 2): the SD single file, a VAE, Flux's four files,
Z-Image's three, and a LoRA for network.network_weights."""
from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import save_file

from test_flux_single_files import _load as load_flux, comfy_files as flux_files  # noqa: F401 (fixture)
from test_zimage_model import _load as load_zimage, comfy_files as zimage_files, tiny  # noqa: F401 (fixtures)
from trainer_backend.errors import ConfigError
from trainer_backend.families import detect_family, load_model
from trainer_backend.families.sd.single_file_export import save_single_file
from trainer_backend.methods.network_weights import read_file

RELABEL = {"F32": "I32", "BF16": "I16", "F16": "I16"}


def relabelled(src, dst, pick=None) -> str:
    """A copy of a .safetensors file with one floating-point weight's dtype renamed to the integer type
    of the same width (the header keeps its length: safetensors pads it with spaces); its name."""
    data = src.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] in RELABEL
                and k.endswith(".weight") and (pick is None or pick in k))
    header[name]["dtype"] = RELABEL[header[name]["dtype"]]
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data[:8] + text.ljust(length, b" ") + data[8 + length:])
    return name


def _one_line(error: ConfigError, option: str, path, name: str) -> None:
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"{option}: ") and str(path.name) in message and f"tensor {name} is I" in message, \
        message
    assert "floating-point" in message


def test_sd_single_file_and_vae(tiny_models, tmp_path):
    folder = tiny_models("sd1")
    good = save_single_file(folder, tmp_path / "sd1.safetensors")
    bad = tmp_path / "bad" / "sd1.safetensors"
    name = relabelled(good, bad)
    with pytest.raises(ConfigError) as e:
        detect_family(str(bad))
    _one_line(e.value, "model.path", bad, name)
    vae = tmp_path / "bad" / "vae.safetensors"
    name = relabelled(good, vae, pick="first_stage_model")
    with pytest.raises(ConfigError) as e:
        load_model(str(folder), vae=str(vae))
    _one_line(e.value, "model.vae", vae, name)


@pytest.mark.parametrize("option", ["path", "clip_l", "t5", "vae"])
def test_each_of_fluxs_four_files(flux_files, tmp_path, option):  # noqa: F811
    bad = tmp_path / flux_files[option].name
    name = relabelled(flux_files[option], bad)
    with pytest.raises(ConfigError) as e:
        load_flux(flux_files, **{option: str(bad)})
    _one_line(e.value, f"model.{option}", bad, name)


@pytest.mark.parametrize("option", ["path", "text_encoder", "vae"])
def test_each_of_zimages_files(zimage_files, tmp_path, option):  # noqa: F811
    bad = tmp_path / zimage_files[option].name
    name = relabelled(zimage_files[option], bad)
    with pytest.raises(ConfigError) as e:
        load_zimage(zimage_files, **{option: str(bad)})
    _one_line(e.value, f"model.{option}", bad, name)


def test_a_lora_for_network_weights(tmp_path):
    good = tmp_path / "lora.safetensors"
    save_file({"lora_unet_mid.lora_down.weight": torch.zeros(4, 8), "lora_unet_mid.lora_up.weight": torch.zeros(8, 4),
               "lora_unet_mid.alpha": torch.tensor(4.0)}, str(good))
    bad = tmp_path / "bad" / "lora.safetensors"
    name = relabelled(good, bad)
    with pytest.raises(ConfigError) as e:
        read_file(str(bad))
    _one_line(e.value, "network.network_weights", bad, name)
    assert read_file(str(good))[0].keys() == {"lora_unet_mid.lora_down.weight", "lora_unet_mid.lora_up.weight",
                                               "lora_unet_mid.alpha"}
    shutil.rmtree(tmp_path / "bad")
