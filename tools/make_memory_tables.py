"""Write assets/memory_tables.json: what the memory planner (trainer_backend/launch/memory_plan.py) knows
of each family's full-size model, measured on the meta device (no weights, no GPU, no download).

Per family: every component's exact parameter count, its Linear/Conv2d layers (adapter sizes follow),
the denoiser's blocks (block swap), and the activation memory of one training step measured by
trainer_backend/training/memory_probe.py at two image sizes (bytes = per sample × (a + b × latent
pixels)) for LoRA and full fine-tuning, with and without gradient checkpointing, plus the VAE's
encode and the text encoders' forward.

    python tools/make_memory_tables.py [--families sd1,sdxl] [--out assets/memory_tables.json]
    python tools/make_memory_tables.py --flops-only   # only the denoisers' forward FLOPs (step time)
    python tools/make_memory_tables.py --families flux2-dev   # a variant (VARIANTS): Flux.2 dev's own table
    python tools/make_memory_tables.py --builtin   # the builtin:tiny-* models' sizes, from their own files

Takes a few minutes per family on a CPU (the meta device only builds shapes).
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "assets" / "memory_tables.json"
# families whose bundled configs lack some components: (component -> assets/model_configs/<folder>, class)
# (a folder holding config.json, or a .json file)
BORROWED = {
    "sd3": {"text_encoder": ("sd1/text_encoder", "CLIPTextModelWithProjection"),
            "text_encoder_2": ("sdxl/text_encoder_2", None), "text_encoder_3": ("flux/text_encoder_2", None),
            "vae": ("flux/vae", None)},
    # Flux.2 keeps its configs as single files (families/flux2/components.py); the table is Klein 4B's
    "flux2": {"text_encoder": ("flux2/text_encoder-qwen3-4b.json", None), "vae": ("flux2/vae.json", None)},
    # Z-Image loads its Qwen3 as the bare decoder (model_index.json: Qwen3Model): no logits over the vocabulary
    "zimage": {"text_encoder": ("zimage/text_encoder", "Qwen3Model")},
    # Qwen-Image-Edit is Qwen-Image's architecture (same transformer, Qwen2.5-VL 7B and VAE configs)
    "qwen_image_edit": {"text_encoder": ("qwen_image/text_encoder", None), "vae": ("qwen_image/vae", None)},
    "qwen_image_edit_plus": {"text_encoder": ("qwen_image/text_encoder", None), "vae": ("qwen_image/vae", None)},
    "chroma": {"text_encoder": ("flux/text_encoder_2", None), "vae": ("flux/vae", None)},
    # Ideogram 4 decodes with Flux.2's AutoencoderKLFlux2
    "ideogram4": {"text_encoder": ("ideogram4/text_encoder.json", None), "vae": ("flux2/vae.json", None)},
    # Krea 2 decodes with Qwen-Image's autoencoder
    "krea2": {"vae": ("qwen_image/vae", None)},
    # Wan 2.2 TI2V-5B reads the same UMT5-XXL as the A14B models (its VAE, the Wan 2.2 one, is its own)
    "wan22_ti2v": {"text_encoder": ("wan22_t2v/text_encoder", None)},
}
NOTES = {"chroma": "Chroma1-HD (the bundled transformer config); FLUX.1's T5-XXL and 16-channel VAE from the "
                   "bundled Flux configs",
         "sd3": "Stable Diffusion 3.5 Medium (the bundled transformer config); CLIP-L, CLIP-G and T5-XXL "
                "text encoders and the 16-channel VAE from the bundled SD1/SDXL/Flux configs",
         "flux2": "Flux.2 Klein 4B (transformer-klein-4b.json) with Qwen3-4B; Klein 9B (Qwen3-8B) is larger",
         "qwen_image_edit": "Qwen-Image-Edit: the control image's latents double the transformer's image tokens; the text "
                            "encoder runs every step unless the latents are cached too (it reads the control image) and its "
                            "pass here leaves out the control image's vision tokens",
         "qwen_image_edit_plus": "Qwen-Image-Edit-2509/2511: measured with three reference images (the most it takes), whose "
                                 "latents follow the target's tokens; the text encoder runs every step unless the latents are "
                                 "cached too, and its pass here leaves out the references' vision tokens",
         "zimage": "Z-Image (Turbo and base share the architecture) with Qwen3-4B",
         "qwen_image": "Qwen-Image 20B with Qwen2.5-VL 7B",
         "krea2": "Krea 2 (Raw and Turbo share the 12.8B transformer) with Qwen3-VL 4B and Qwen-Image's VAE",
         "qwen_image21": "Qwen-Image 2.1 (7.1B transformer) with Qwen3-VL 8B; an edit pair's text is encoded every step "
                         "unless the latents are cached too (the encoder reads its control image) and its pass here leaves"
                         " out the control image's vision tokens; measured without control images",
         "wan22_t2v": "Wan 2.2 T2V-A14B: one 14.3B expert (the two experts are the same shape; model.expert = both "
                      "keeps both resident) with UMT5-XXL and the Wan 2.1 VAE; activations per latent pixel of ONE "
                      "latent frame: a clip's are × its latent frames ((frames - 1) / 4 + 1)",
         "wan22_i2v": "Wan 2.2 I2V-A14B: one 14.3B expert (36 input channels: the noisy latents, the first frame's "
                      "mask and latents; model.expert = both keeps both resident) with UMT5-XXL and the Wan 2.1 VAE "
                      "(the UMT5 and VAE configs are T2V-A14B's); activations per latent pixel of ONE latent frame; "
                      "the first-frame condition (cached with the latents) is an uncached step's VAE pass of its own, "
                      "4 frames at a time",
         "ltx2": "LTX-2 (18.9B audio-video transformer, video LoRA: the audio stream runs on one token) with Gemma 3 12B "
                 "(its vision tower loaded too) and the 1.4B text connectors counted with it, and the video VAE (32x "
                 "spatial, 8x temporal); activations per latent pixel of ONE latent frame: a clip's are x its latent "
                 "frames ((frames - 1) / 8 + 1); the VAE encodes a clip's frames at once",
         "wan22_ti2v": "Wan 2.2 TI2V-5B: one 5.0B transformer over the 48-channel latents of the Wan 2.2 VAE (16x "
                       "spatial, 4x temporal) with UMT5-XXL (T2V-A14B's config); activations per latent pixel of ONE "
                       "latent frame: a clip's are x its latent frames ((frames - 1) / 4 + 1)",
         "ideogram4": "Ideogram 4's conditional transformer (9.3 B) with Qwen3-VL-8B; the unconditional transformer "
                      "(another 9.3 B) is loaded for samples only and is not counted"}

# modules a family keeps in LoadedModel.options that run with a component, on its device and in its dtype:
# component -> (option name, the module holding the class named by its config's _class_name); built from
# assets/model_configs/<family>/<option> and counted in that component's entry (memory_probe.static_table)
COMPANIONS = {"ltx2": {"text_encoder": ("connectors", "diffusers.pipelines.ltx2")}}

# options that train several denoisers of the table's size at once (launch/memory_plan.denoiser_copies)
DENOISER_COPIES = {"wan22_t2v": {"option": "model.expert", "values": {"both": 2}},
                   "wan22_i2v": {"option": "model.expert", "values": {"both": 2}}}
# causal video VAEs that encode a clip a few frames at a time (AutoencoderKLWan: the first frame, then 4 by 4)
VAE_FRAMES_AT_ONCE = {"wan22_t2v": 4, "wan22_i2v": 4, "wan22_ti2v": 4}
# video VAEs that encode a clip's frames at once, shrinking time as they go (LTX-2's): the encode of a clip of this
# many frames is probed against one frame's; the table's vae_frame_share is what each further frame adds
VAE_CLIP_PROBE = {"ltx2": 49}

# the larger of the two square sides a family's step is probed at (the smaller is half): 1024 px, SD1/SD2 512;
# the Wan 2.2 VAE compresses 16x, so TI2V-5B is probed on the latent grids 1024-2048 px give 8x families (smaller
# ones hide a full fine-tune's activations under its gradients); LTX-2 (32x) at 1024-2048 px, 1024-4096 video tokens:
# at 256-1024 its 1024 text tokens' per-block cost bends the line (checkpointed: 16% low at 6,400 tokens)
PROBE_SIDES = {"sd1": 512, "sd2": 512, "wan22_ti2v": 4096, "ltx2": 2048}


def probe_side(arch: str) -> int:
    return PROBE_SIDES.get(arch, 1024)


# an option that makes every step of a family bigger, probed again with it on (the table's "activations_if",
# launch/memory_plan.activation_lines): TI2V-5B's start images turn on per-token timesteps
ACTIVATIONS_IF = {"wan22_ti2v": ("dataset.video_start_image_probability", 1.0)}

# families whose table describes only some of their models: the pipeline classes it was measured on
# (memory_tables.pipeline_outside_table: a Flux.2 dev folder gets no plan rather than Klein 4B's)
PIPELINES = {"flux2": ("Flux2KleinPipeline", "Flux2KleinKVPipeline")}

# models of a family its table does not describe, with a table of their own (the file's "variants";
# memory_tables.variant_table picks one by a diffusers folder's pipeline or a single file's keys):
# name -> the family, the meta_denoiser size, the tiny model, the borrowed configs, what picks it
VARIANTS = {
    "flux2-dev": {"family": "flux2", "denoiser": {"size": "dev"}, "tiny": "tiny-flux2-dev",
                  "borrowed": {"text_encoder": ("flux2/text_encoder-mistral-small-3.json", None),
                               "vae": ("flux2/vae.json", None)},
                  "pipelines": ["Flux2Pipeline"], "file_keys": ["guidance_in.in_layer.weight"],
                  "note": "Flux.2 dev 32B (transformer-dev.json) with Mistral Small 3 24B "
                          "(text_encoder-mistral-small-3.json, with its vision tower, as loaded)"},
}


def spec_of(name: str) -> dict:
    """What builds a table: a family's (its bundled configs) or a variant's (VARIANTS)."""
    if name in VARIANTS:
        return VARIANTS[name]
    return {"family": name, "denoiser": {}, "tiny": f"tiny-{name}", "borrowed": BORROWED.get(name, {}),
            "pipelines": list(PIPELINES.get(name, ())), "note": NOTES.get(name, "")}


def build_components(name: str) -> dict:
    """The full-size modules of a family (or VARIANTS entry) on the meta device, in fp32."""
    import diffusers
    import torch
    import transformers
    from trainer_backend.families.registry import get_family
    from trainer_backend.families.sd.loader import ASSETS_CONFIGS
    spec = spec_of(name)
    arch = spec["family"]
    family = get_family(arch)
    folder = getattr(family, "full_size_config", arch)
    out = {family.denoiser_name: family.meta_denoiser(**spec["denoiser"])}
    with torch.device("meta"):
        for part in (*family.text_encoder_names, "vae"):
            sub, cls_name = spec["borrowed"].get(part, (f"{folder}/{part}", None))
            path = ASSETS_CONFIGS / sub
            config = json.loads((path if path.suffix == ".json" else path / "config.json").read_text())
            config = {k: v for k, v in config.items() if k != "_note"}
            if "_class_name" in config:
                cls = getattr(diffusers, cls_name or config["_class_name"])
                out[part] = cls.from_config(config)
            else:
                cls = getattr(transformers, cls_name or config["architectures"][0])
                out[part] = cls(cls.config_class.from_dict(config))
        for option, module in COMPANIONS.get(arch, {}).values():
            config = json.loads((ASSETS_CONFIGS / folder / option / "config.json").read_text())
            cls = getattr(importlib.import_module(module), config["_class_name"])
            out[option] = cls.from_config({k: v for k, v in config.items() if k != "_note"})
    return out


def _full_size(name: str):
    """(the family's name, a loader of the full-size LoadedModel on the meta device)."""
    from trainer_backend.families.builtin import resolve_model_path
    from trainer_backend.training import memory_probe as mp
    spec = spec_of(name)
    tiny = resolve_model_path(f"builtin:{spec['tiny']}")
    return spec["family"], lambda: mp.full_size_model(spec["family"], tiny, build_components(name))


def companions(name: str) -> dict[str, str]:
    """component -> the option module counted with it (COMPANIONS), for memory_probe.static_table."""
    return {part: option for part, (option, _) in COMPANIONS.get(spec_of(name)["family"], {}).items()}


def static_family(name: str) -> dict:
    from trainer_backend.training import memory_probe as mp
    table = mp.static_table(_full_size(name)[1](), companions(name))
    del table["activations"]  # measured by probe_family; kept as they are
    return table


def probe_family(name: str, log=print) -> dict:
    from trainer_backend.training import memory_probe as mp
    arch, loader = _full_size(name)
    spec = spec_of(name)
    base = probe_side(arch)
    overrides = {"model": {"arch": arch}, "network": {"rank": 16}, "precision": {"mixed": "bf16"}}
    table = mp.measure_table(loader, overrides, (base // 2, base), log=log, companions=companions(name))
    if spec["family"] in ACTIVATIONS_IF:
        option, value = ACTIVATIONS_IF[spec["family"]]
        section, key = option.split(".")
        on = mp.measure_table(loader, {**overrides, section: {key: value}}, (base // 2, base), log=log,
                              companions=companions(name))
        table["activations_if"] = {"option": option, "lines": on["activations"]}
    table["note"] = spec["note"]
    if spec["family"] in DENOISER_COPIES:
        table["denoiser_copies"] = DENOISER_COPIES[spec["family"]]
    if spec["family"] in VAE_FRAMES_AT_ONCE:
        table["vae_frames_at_once"] = VAE_FRAMES_AT_ONCE[spec["family"]]
    if spec["family"] in VAE_CLIP_PROBE:
        table["vae_frame_share"] = vae_frame_share(loader(), base // 2, VAE_CLIP_PROBE[spec["family"]])
    if spec["pipelines"]:
        table["pipelines"] = list(spec["pipelines"])
    if name in VARIANTS:
        table.update(family=arch, file_keys=list(spec["file_keys"]))
    return table


def vae_frame_share(model, side: int, frames: int) -> float:
    """What each frame after the first adds to a clip's VAE encode, as a share of one frame's (meta device)."""
    from trainer_backend.training import memory_probe as mp
    for module in model.components().values():
        module.to("meta")
    one, clip = (mp.probe_vae_encode(model, (side, side), 1, "meta", frames=n) for n in (1, frames))
    return round((clip / one - 1) / (frames - 1), 4)


def flops_family(name: str) -> dict:
    """The denoiser's forward and the VAE encode's FLOPs per sample = a + b × latent pixels; read by
    trainer_backend/launch/step_time.py."""
    from trainer_backend.training import memory_probe as mp
    arch, loader = _full_size(name)
    base = probe_side(arch)
    return mp.flops_table(loader, (base // 2, base))


def builtin_entries() -> dict:
    """Each builtin:tiny-* model's family, pipeline class and components, read from the tiny model's own
    weight files by the planner's own function (launch/model_size.py folder_components): the planner
    sizes a builtin model before it is built (the studio builds it only when a run starts)."""
    from trainer_backend.families.builtin import resolve_model_path
    from trainer_backend.families.registry import BUILTIN_TINY
    from trainer_backend.launch.memory_tables import family_table
    from trainer_backend.launch.model_size import folder_components, pipeline_class
    out = {}
    for name, (family, _) in BUILTIN_TINY.items():
        table = family_table(family)
        if table is None:  # a family without its table yet: run this again once it has one
            print(f"{name}: no table for {family} yet; skipped")
            continue
        folder = resolve_model_path(f"builtin:{name}")
        out[name] = {"family": family, "pipeline": pipeline_class(folder),
                     "components": folder_components(folder, table["components"])}
    return out


def main(argv=None) -> int:
    from trainer_backend.families.registry import FAMILY_NAMES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILY_NAMES))
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--static-only", action="store_true",
                    help="refresh only the parameter counts, layers and blocks of families already in the file")
    ap.add_argument("--flops-only", action="store_true",
                    help="add or refresh only the denoiser's forward FLOPs of families already in the file "
                         "(no memory probe)")
    ap.add_argument("--builtin", action="store_true", help="refresh only the builtin:tiny-* models' entries")
    args = ap.parse_args(argv)
    out = Path(args.out)
    tables = json.loads(out.read_text()) if out.is_file() else {}
    if args.builtin:
        tables["builtin"] = builtin_entries()
        out.write_text(json.dumps(tables, indent=1) + "\n")
        print(f"wrote {len(tables['builtin'])} builtin models to {out}")
        return 0
    tables.setdefault("families", {})
    tables["about"] = ("Written by tools/make_memory_tables.py: full-size models on the meta device; "
                       "activation bytes per sample = a + b * latent pixels (a GPU's view, bf16 autocast, "
                       "fused attention). Read by trainer_backend/launch/memory_plan.py.")
    tables.setdefault("variants", {})
    for arch in [a.strip() for a in args.families.split(",") if a.strip()]:
        where = tables["variants"] if arch in VARIANTS else tables["families"]
        if args.flops_only and arch in where:
            started = time.monotonic()
            where[arch]["flops"] = flops_family(arch)
            print(f"{arch}: forward FLOPs {where[arch]['flops']} ({time.monotonic() - started:.0f} s)")
        elif args.static_only and arch in where:
            where[arch].update(static_family(arch))
        else:
            where[arch] = probe_family(arch)
        out.write_text(json.dumps(tables, indent=1) + "\n")
        print(f"wrote {arch} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
