"""The registered model families: names for the schema and the GUI (pure: no torch here),
and the Family objects behind them (imported on first use).

A family is one folder under `families/` that implements the contract in `families/base.py`
and registers here with one line. Nothing outside `families/` asks which family a model is:
it asks the family.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module


@dataclass(frozen=True)
class FamilyEntry:
    name: str          # the `model.arch` value
    label: str         # what the GUI shows
    module: str        # the folder (package) that implements the family
    attr: str          # the Family object in that package
    objective: str     # "ddpm" (UNet, epsilon/v-prediction) or "flow" (rectified flow transformers)
    # the LoRA file key layouts the family writes (output.lora_format); the first is its default
    lora_layouts: tuple[str, ...] = ("kohya",)
    # model.clip_skip applies: the text conditioning is one CLIP encoder's last hidden state, so a
    # layer counted from the end can replace it (SDXL already uses the penultimate layer by design)
    clip_skip: bool = False
    # paired control (reference) images per training image (dataset.control_path): "" = not used,
    # "optional", "required" (an edit model); the same value as the Family's `control_images`
    control_images: str = ""
    # network.train_text_encoder applies: the family's LoRA loaders also load text-encoder adapters
    # (False: the text encoder stays frozen, as Z-Image's loaders read the transformer only)
    text_encoder_training: bool = True
    # further tiny models besides builtin:tiny-<name>: builtin:tiny-<name>-<variant>, built by the family's
    # build_tiny(variant=<variant>) (Flux.2 dev beside Klein)
    tiny_variants: tuple[str, ...] = ()
    # reference (control) images per training image at most (data/pairs.py's numbered names); the same
    # value as the Family's `max_control_images`
    max_control_images: int = 1
    # video families: clip frame counts are k * frame_step + 1 and the VAE compresses time by it (Wan 4,
    # LTX-2 8); 0 = an image family. The same value as the Family's `frame_step`
    frame_step: int = 0
    # image-to-video: the sampling pipeline starts from an image, so a sample prompt may give one with `--control`
    # (training takes no control folder: control_images stays ""); the same value as the Family's
    takes_start_image: bool = False
    # the model has an audio stream (LTX-2): a clip's audio track trains with its frames (dataset.video_audio);
    # the same value as the Family's `audio_stream`
    audio_stream: bool = False


FAMILIES: tuple[FamilyEntry, ...] = (
    FamilyEntry("sd1", "Stable Diffusion 1.x", "trainer_backend.families.sd", "SD1", "ddpm", clip_skip=True),
    FamilyEntry("sd2", "Stable Diffusion 2.x", "trainer_backend.families.sd", "SD2", "ddpm", clip_skip=True),
    FamilyEntry("sdxl", "Stable Diffusion XL", "trainer_backend.families.sd", "SDXL", "ddpm"),
    FamilyEntry("sd3", "Stable Diffusion 3 / 3.5", "trainer_backend.families.sd3", "SD3", "flow",
                ("diffusers", "kohya")),
    FamilyEntry("flux", "Flux.1 (dev, schnell)", "trainer_backend.families.flux", "FLUX", "flow",
                ("diffusers", "kohya")),
    FamilyEntry("chroma", "Chroma (Chroma1-HD, Chroma1-Base)", "trainer_backend.families.chroma", "CHROMA", "flow",
                ("diffusers", "kohya"), text_encoder_training=False),
    FamilyEntry("zimage", "Z-Image (Turbo, base)", "trainer_backend.families.zimage", "ZIMAGE", "flow",
                ("diffusers", "kohya", "original"), text_encoder_training=False),
    FamilyEntry("flux2", "Flux.2 (Klein 4B, 9B; dev)", "trainer_backend.families.flux2", "FLUX2", "flow",
                ("kohya", "diffusers"), control_images="optional", text_encoder_training=False,
                tiny_variants=("dev",)),
    FamilyEntry("qwen_image", "Qwen-Image", "trainer_backend.families.qwen_image", "QWEN_IMAGE", "flow",
                ("diffusers", "kohya"), text_encoder_training=False),
    FamilyEntry("qwen_image_edit", "Qwen-Image-Edit", "trainer_backend.families.qwen_image", "QWEN_IMAGE_EDIT", "flow",
                ("diffusers", "kohya"), control_images="required", text_encoder_training=False),
    FamilyEntry("qwen_image_edit_plus", "Qwen-Image-Edit-2509 / 2511", "trainer_backend.families.qwen_image",
                "QWEN_IMAGE_EDIT_PLUS", "flow", ("diffusers", "kohya"), control_images="required",
                text_encoder_training=False, tiny_variants=("2511",), max_control_images=3),
    FamilyEntry("qwen_image21", "Qwen-Image 2.1 (generation and editing)", "trainer_backend.families.qwen_image21",
                "QWEN_IMAGE_21", "flow", ("diffusers", "original"), control_images="optional", text_encoder_training=False),
    FamilyEntry("ideogram4", "Ideogram 4", "trainer_backend.families.ideogram4", "IDEOGRAM4", "flow",
                ("diffusers", "original"), text_encoder_training=False),
    FamilyEntry("krea2", "Krea 2 (Raw, Turbo)", "trainer_backend.families.krea2", "KREA2", "flow",
                ("diffusers", "original"), control_images="optional", text_encoder_training=False,
                tiny_variants=("turbo",), max_control_images=3),
    FamilyEntry("wan22_t2v", "Wan 2.2 text-to-video (A14B, two experts)", "trainer_backend.families.wan", "WAN22_T2V",
                "flow", ("diffusers", "kohya"), text_encoder_training=False, frame_step=4),
    FamilyEntry("wan22_i2v", "Wan 2.2 image-to-video (I2V-A14B, two experts)", "trainer_backend.families.wan",
                "WAN22_I2V", "flow", ("diffusers", "kohya"), text_encoder_training=False, frame_step=4,
                takes_start_image=True),
    FamilyEntry("wan22_ti2v", "Wan 2.2 TI2V-5B (text- and image-to-video, one transformer)",
                "trainer_backend.families.wan", "WAN22_TI2V", "flow", ("diffusers", "kohya"),
                text_encoder_training=False, frame_step=4, takes_start_image=True),
    FamilyEntry("ltx2", "LTX-2 (video with audio)", "trainer_backend.families.ltx2", "LTX2", "flow",
                ("diffusers", "kohya"), text_encoder_training=False, frame_step=8, audio_stream=True),
)
FAMILY_NAMES: tuple[str, ...] = tuple(e.name for e in FAMILIES)
ARCH_CHOICES: tuple[str, ...] = ("auto", *FAMILY_NAMES)
# for options that apply to one kind of family only (config `when` conditions)
DDPM_FAMILIES: tuple[str, ...] = tuple(e.name for e in FAMILIES if e.objective == "ddpm")
FLOW_FAMILIES: tuple[str, ...] = tuple(e.name for e in FAMILIES if e.objective == "flow")
CLIP_SKIP_FAMILIES: tuple[str, ...] = tuple(e.name for e in FAMILIES if e.clip_skip)
# LoRA key layouts (output.lora_format choices besides "auto"), and the families that offer a choice
LORA_LAYOUTS: tuple[str, ...] = tuple(dict.fromkeys(layout for e in FAMILIES for layout in e.lora_layouts))
LORA_LAYOUT_CHOICE_FAMILIES: tuple[str, ...] = tuple(e.name for e in FAMILIES if len(e.lora_layouts) > 1)
# paired control images (families/base.py Family.control_images): the families that take them at all
CONTROL_IMAGE_MODES: tuple[str, ...] = ("", "optional", "required")
VIDEO_FAMILIES: tuple[str, ...] = tuple(e.name for e in FAMILIES if e.frame_step)
AUDIO_FAMILIES: tuple[str, ...] = tuple(e.name for e in FAMILIES if e.audio_stream)
CONTROL_FAMILIES: tuple[str, ...] = tuple(e.name for e in FAMILIES if e.control_images)
# builtin:<name> tiny models: name -> (family, variant; "" = the family's default tiny model)
BUILTIN_TINY: dict[str, tuple[str, str]] = {
    **{f"tiny-{e.name}": (e.name, "") for e in FAMILIES},
    **{f"tiny-{e.name}-{v}": (e.name, v) for e in FAMILIES for v in e.tiny_variants}}


def entry(name: str) -> FamilyEntry:
    for e in FAMILIES:
        if e.name == name:
            return e
    raise KeyError(f"unknown model family {name!r} (registered: {', '.join(FAMILY_NAMES)})")


def get_family(name: str):
    """The Family object for `name` (imports its package, which may import torch)."""
    e = entry(name)
    return getattr(import_module(e.module), e.attr)


def all_families() -> list:
    return [get_family(name) for name in FAMILY_NAMES]
