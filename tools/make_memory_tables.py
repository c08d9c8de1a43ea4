"""Write assets/memory_tables.json: what the memory planner (trainer_backend/launch/memory_plan.py) knows
of each family's full-size model, measured on the meta device (no weights, no GPU, no download).

Per family: every component's exact parameter count, its Linear/Conv2d layers (adapter sizes follow),
the denoiser's blocks (block swap), and the activation memory of one training step measured by
trainer_backend/training/memory_probe.py at two image sizes (bytes = per sample × (a + b × latent
pixels)) for LoRA and full fine-tuning, with and without gradient checkpointing, plus the VAE's
encode and the text encoders' forward.

    python tools/make_memory_tables.py [--families sd1,sdxl] [--out assets/memory_tables.json]
    python tools/make_memory_tables.py --flops-only   # only the denoisers' forward FLOPs (step time)

Takes a few minutes per family on a CPU (the meta device only builds shapes).
"""
from __future__ import annotations

import argparse
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
}
NOTES = {"chroma": "Chroma1-HD (the bundled transformer config); FLUX.1's T5-XXL and 16-channel VAE from the "
                   "bundled Flux configs",
         "sd3": "Stable Diffusion 3.5 Medium (the bundled transformer config); CLIP-L, CLIP-G and T5-XXL "
                "text encoders and the 16-channel VAE from the bundled SD1/SDXL/Flux configs",
         "flux2": "Flux.2 Klein 4B (transformer-klein-4b.json) with Qwen3-4B; Klein 9B (Qwen3-8B) is larger",
         "qwen_image_edit": "Qwen-Image-Edit: the control image's latents double the transformer's image tokens; "
                            "the text encoder runs every step (it reads the control image) and its pass here "
                            "leaves out the control image's vision tokens",
         "qwen_image_edit_plus": "Qwen-Image-Edit-2509/2511: measured with three reference images (the most it "
                                 "takes), whose latents follow the target's tokens; the text encoder runs every "
                                 "step and its pass here leaves out the references' vision tokens",
         "zimage": "Z-Image (Turbo and base share the architecture) with Qwen3-4B",
         "qwen_image": "Qwen-Image 20B with Qwen2.5-VL 7B"}

# families whose table describes only some of their models: the pipeline classes it was measured on
# (memory_tables.pipeline_outside_table: a Flux.2 dev folder gets no plan rather than Klein 4B's)
PIPELINES = {"flux2": ("Flux2KleinPipeline", "Flux2KleinKVPipeline")}


def build_components(arch: str) -> dict:
    """The family's full-size modules on the meta device, in fp32."""
    import diffusers
    import torch
    import transformers
    from trainer_backend.families.registry import get_family
    from trainer_backend.families.sd.loader import ASSETS_CONFIGS
    family = get_family(arch)
    folder = getattr(family, "full_size_config", arch)
    out = {family.denoiser_name: family.meta_denoiser()}
    with torch.device("meta"):
        for name in (*family.text_encoder_names, "vae"):
            sub, cls_name = BORROWED.get(arch, {}).get(name, (f"{folder}/{name}", None))
            path = ASSETS_CONFIGS / sub
            config = json.loads((path if path.suffix == ".json" else path / "config.json").read_text())
            config = {k: v for k, v in config.items() if k != "_note"}
            if "_class_name" in config:
                cls = getattr(diffusers, cls_name or config["_class_name"])
                out[name] = cls.from_config(config)
            else:
                cls = getattr(transformers, cls_name or config["architectures"][0])
                out[name] = cls(cls.config_class.from_dict(config))
    return out


def static_family(arch: str) -> dict:
    from trainer_backend.families.builtin import resolve_model_path
    from trainer_backend.training import memory_probe as mp
    tiny = resolve_model_path(f"builtin:tiny-{arch}")
    table = mp.static_table(mp.full_size_model(arch, tiny, build_components(arch)))
    del table["activations"]  # measured by probe_family; kept as they are
    return table


def probe_family(arch: str, log=print) -> dict:
    from trainer_backend.families.builtin import resolve_model_path
    from trainer_backend.training import memory_probe as mp
    tiny = resolve_model_path(f"builtin:tiny-{arch}")
    base = 1024 if arch not in ("sd1", "sd2") else 512
    overrides = {"model": {"arch": arch}, "network": {"rank": 16}, "precision": {"mixed": "bf16"}}
    table = mp.measure_table(lambda: mp.full_size_model(arch, tiny, build_components(arch)), overrides,
                             (base // 2, base), log=log)
    table["note"] = NOTES.get(arch, "")
    if arch in PIPELINES:
        table["pipelines"] = list(PIPELINES[arch])
    return table


def flops_family(arch: str) -> dict:
    """The denoiser's forward and the VAE encode's FLOPs per sample = a + b × latent pixels; read by
    trainer_backend/launch/step_time.py."""
    from trainer_backend.families.builtin import resolve_model_path
    from trainer_backend.training import memory_probe as mp
    tiny = resolve_model_path(f"builtin:tiny-{arch}")
    base = 1024 if arch not in ("sd1", "sd2") else 512
    return mp.flops_table(lambda: mp.full_size_model(arch, tiny, build_components(arch)), (base // 2, base))


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
    args = ap.parse_args(argv)
    out = Path(args.out)
    tables = json.loads(out.read_text()) if out.is_file() else {}
    tables.setdefault("families", {})
    tables["about"] = ("Written by tools/make_memory_tables.py: full-size models on the meta device; "
                       "activation bytes per sample = a + b * latent pixels (a GPU's view, bf16 autocast, "
                       "fused attention). Read by trainer_backend/launch/memory_plan.py.")
    for arch in [a.strip() for a in args.families.split(",") if a.strip()]:
        if args.flops_only and arch in tables["families"]:
            started = time.monotonic()
            tables["families"][arch]["flops"] = flops_family(arch)
            print(f"{arch}: forward FLOPs {tables['families'][arch]['flops']} ({time.monotonic() - started:.0f} s)")
        elif args.static_only and arch in tables["families"]:
            tables["families"][arch].update(static_family(arch))
        else:
            tables["families"][arch] = probe_family(arch)
        out.write_text(json.dumps(tables, indent=1, sort_keys=True) + "\n")
        print(f"wrote {arch} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
