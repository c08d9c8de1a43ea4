"""The models and images the cases train on, built where they run (nothing is downloaded).

    python models.py --model sdxl --out DIR [--device cuda] [--tiny]
    python models.py --images DIR --size 1024 [--count 4]

Full size: each component is built from the bundled configs (assets/model_configs/<arch>/) with
random weights, on the device and in bf16 (speed and memory do not depend on the values; the
trainers cast to their own dtypes on load), then saved as a diffusers folder that our trainer and
the diffusers examples both load. The CLIP and T5 tokenizers are the project's offline ones
(their ids lie inside the real vocabularies, and the text encoders' special ids follow them).
Tiny: the family's own tiny random model (`builtin:tiny-<arch>`'s factory).
Runs in its own process, after the carried wheels are installed (diffusers is imported here).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "assets" / "model_configs"
BUILT_MARKER = ".gpubench-built"
ARCH = {"sd15": "sd1", "sdxl": "sdxl", "flux": "flux", "zimage": "zimage", "qwen_image": "qwen_image",
        "flux2_klein": "flux2"}
# Families built from their tiny folder (tokenizers, scheduler, model_index.json: the layout the family
# loads) with each weighted component replaced by a full-size random one from these bundled configs
FULL_COMPONENTS = {
    "zimage": {"transformer": "zimage/transformer/config.json", "vae": "zimage/vae/config.json",
               "text_encoder": "zimage/text_encoder/config.json"},
    "qwen_image": {"transformer": "qwen_image/transformer/config.json", "vae": "qwen_image/vae/config.json",
                   "text_encoder": "qwen_image/text_encoder/config.json"},
    "flux2_klein": {"transformer": "flux2/transformer-klein-4b.json", "vae": "flux2/vae.json",
                    "text_encoder": "flux2/text_encoder-qwen3-4b.json"},
}
# The device's disk (64 GiB) does not hold Qwen-Image in bf16 (20.4 B transformer + 8.3 B Qwen2.5-VL = 57 GiB)
# beside anything else: its text encoder keeps 4 of 28 language layers (full width, so its outputs fit the
# transformer). The cases cache the text: the encoder runs only in the cache pass, whose peak is then smaller
# than the real model's (the report's planner column says which phase the planner's peak is in).
SHRUNK = {"qwen_image": {"text_encoder": {"text_config": {"num_hidden_layers": 4}}}}
FLUX_INDEX = {"_class_name": "FluxPipeline", "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
              "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
              "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
              "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
T5_MAX_LENGTH = 512  # FLUX.1 dev's


def _json(path: Path) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def _clip_encoder(sub: str, cfg_dir: Path, tokenizer_dir: Path, device: str, dtype):
    """A CLIP text encoder with the bundled config; special ids from our tokenizer."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer
    tok = CLIPTokenizer.from_pretrained(str(tokenizer_dir))
    raw = _json(cfg_dir / sub / "config.json")
    cls = CLIPTextModelWithProjection if raw.get("architectures") == ["CLIPTextModelWithProjection"] else CLIPTextModel
    raw.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = CLIPTextConfig(**raw)
    with _device(device):
        return cls._from_config(config, dtype=dtype)


def _device(device: str):
    import torch
    return torch.device(device)


def _diffusers_model(cls, folder: Path, device: str, dtype):
    import torch
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are created in bf16: a 12B transformer never exists in fp32
    try:
        with _device(device):
            return cls.from_config(cls.load_config(str(folder)))
    finally:
        torch.set_default_dtype(previous)


def build_full(model: str, out: Path, device: str) -> None:
    import torch
    from diffusers import AutoencoderKL, FluxTransformer2DModel, UNet2DConditionModel
    sys.path.insert(0, str(ROOT))
    from trainer_backend.families.sd.tiny_tokenizer import EOS, write_tokenizer
    arch = ARCH[model]
    cfg_dir, dtype = CONFIGS / arch, torch.bfloat16
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out / "tokenizer", pad_token=EOS)
    shutil.copytree(cfg_dir / "scheduler", out / "scheduler", dirs_exist_ok=True)
    parts = {"vae": (AutoencoderKL, cfg_dir / "vae")}
    if arch == "flux":
        from transformers import T5Config, T5EncoderModel
        from trainer_backend.families.tiny_t5 import write_t5_tokenizer
        write_t5_tokenizer(out / "tokenizer_2", T5_MAX_LENGTH)
        parts["transformer"] = (FluxTransformer2DModel, cfg_dir / "transformer")
        (out / "model_index.json").write_text(json.dumps(FLUX_INDEX, indent=1))
        with _device(device):
            t5 = T5EncoderModel._from_config(T5Config(**_json(cfg_dir / "text_encoder_2" / "config.json")), dtype=dtype)
        _save(t5, out / "text_encoder_2")
    else:
        if arch == "sdxl":
            write_tokenizer(out / "tokenizer_2", pad_token="!")
        parts["unet"] = (UNet2DConditionModel, cfg_dir / "unet")
        shutil.copy(cfg_dir / "model_index.json", out / "model_index.json")
    for sub in ("text_encoder", "text_encoder_2"):
        if (cfg_dir / sub).is_dir() and not (out / sub).is_dir():
            tok = out / ("tokenizer_2" if sub.endswith("_2") else "tokenizer")
            _save(_clip_encoder(sub, cfg_dir, tok, device, dtype), out / sub)
    for sub, (cls, folder) in parts.items():
        _save(_diffusers_model(cls, folder, device, dtype), out / sub)


def build_from_tiny(model: str, out: Path, device: str) -> None:
    """The family's tiny folder, then each of FULL_COMPONENTS built at full size in bf16 on `device` from
    its bundled config (the class the folder's model_index.json names) and saved over the tiny one. The
    tiny Qwen tokenizers' ids lie inside the full vocabularies; their shorter max length only shortens
    the captions, which the cases cache."""
    import diffusers
    import torch
    import transformers
    sys.path.insert(0, str(ROOT))
    from trainer_backend.families import build_tiny_model
    build_tiny_model(ARCH[model], out)
    index = json.loads((out / "model_index.json").read_text())
    for sub, config in FULL_COMPONENTS[model].items():
        library, class_name = index[sub]
        raw = _json(CONFIGS / config)
        for key, value in SHRUNK.get(model, {}).get(sub, {}).items():
            raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
        if library == "diffusers":
            cls = getattr(diffusers, class_name)
            previous = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                with _device(device):
                    module = cls.from_config(raw)
            finally:
                torch.set_default_dtype(previous)
        else:
            cls = getattr(transformers, class_name)
            raw.pop("architectures", None)
            with _device(device):
                module = cls._from_config(cls.config_class.from_dict(raw), dtype=torch.bfloat16)
        if device == "meta":  # the check (tests): every full-size class builds from its config; nothing saved
            print(f"{model}/{sub}: {class_name} {sum(p.numel() for p in module.parameters()) / 1e9:.2f} B parameters")
            continue
        shutil.rmtree(out / sub)
        _save(module, out / sub)


def _save(module, folder: Path) -> None:
    import torch
    module.save_pretrained(str(folder), safe_serialization=True)
    del module
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build(model: str, out: Path, device: str, tiny: bool) -> Path:
    """Build once: a folder with the marker is reused (a cut-off build is rebuilt)."""
    if (out / BUILT_MARKER).is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    if tiny:
        sys.path.insert(0, str(ROOT))
        from trainer_backend.families import build_tiny_model
        build_tiny_model(ARCH[model], out)
    elif model in FULL_COMPONENTS:
        build_from_tiny(model, out, device)
    else:
        build_full(model, out, device)
    (out / BUILT_MARKER).write_text("ok\n")
    return out


def make_images(folder: Path, size: int, count: int = 4) -> Path:
    """`count` smooth random RGB images (gradients plus noise), PNG, size × size: images only, as
    the DreamBooth examples read every file of the folder as an image (captions: the prompt)."""
    import numpy as np
    from PIL import Image
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ramp = np.linspace(0.0, 1.0, size, dtype=np.float32)
    for i in range(count):
        base = rng.random(3, dtype=np.float32)
        pixels = (base[None, None, :] * 0.5 + ramp[None, :, None] * 0.3 + ramp[:, None, None] * 0.2
                  + rng.normal(0.0, 0.05, (size, size, 3)).astype(np.float32))
        Image.fromarray((np.clip(pixels, 0, 1) * 255).astype(np.uint8)).save(folder / f"{i:02d}.png")
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(ARCH))
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--images")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--count", type=int, default=4)
    args = ap.parse_args(argv)
    if args.images:
        make_images(Path(args.images), args.size, args.count)
    if args.model:
        build(args.model, Path(args.out), args.device, args.tiny)
    return 0


if __name__ == "__main__":
    sys.exit(main())
