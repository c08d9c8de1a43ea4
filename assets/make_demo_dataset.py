"""Generate the built-in demo datasets: small images of simple coloured shapes with captions.

    python assets/make_demo_dataset.py [out_folder]             # default: assets/demo_dataset
    python assets/make_demo_dataset.py --concept [out_folder]   # default: assets/demo_concept
    python assets/make_demo_dataset.py --edit-pairs [out_folder] # default: assets/demo_edit_pairs

`demo_dataset`: 8 shapes in 8 colours (the sample dataset the tests and the inspector use).
`demo_concept`: the demo preset's dataset, 8 shapes in pink, the colour the demo base model
(tools/make_demo_model.py, trained on every other colour) has never seen.
`demo_edit_pairs`: original/ control images and edited/ training images whose captions are the edit
instruction, for edit models such as Qwen-Image-Edit.

Deterministic (no randomness), a few KB per image, so the committed files never change unless
this script does. The captions name the shape, colour and background so a LoRA trained on them
has something learnable.
"""
from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image, ImageDraw

SIZE = 64
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 70), "blue": (40, 80, 220), "yellow": (235, 210, 40),
           "purple": (140, 60, 190), "orange": (245, 140, 30), "white": (245, 245, 245), "black": (20, 20, 20),
           "pink": (250, 120, 200)}
# The colour the demo base model never sees: the demo's LoRA teaches it (presets/demo-sd1-lora.toml).
CONCEPT_COLOUR = "pink"
SHAPES = ("circle", "square", "triangle")
BACKGROUNDS = {"light grey": (200, 200, 200), "dark blue": (20, 30, 70), "pale green": (200, 230, 200),
               "beige": (235, 220, 190)}
# (shape, colour, background) for each image
DEMO = [("circle", "red", "light grey"), ("square", "blue", "pale green"), ("triangle", "yellow", "dark blue"),
        ("circle", "green", "beige"), ("square", "orange", "dark blue"), ("triangle", "purple", "light grey"),
        ("circle", "white", "dark blue"), ("square", "black", "beige")]
# (shape, background) of each concept image: every shape, every background
CONCEPT = [("circle", "light grey"), ("square", "dark blue"), ("triangle", "beige"), ("circle", "pale green"),
           ("square", "beige"), ("triangle", "light grey"), ("circle", "dark blue"), ("square", "pale green")]


def draw(shape: str, colour, background, size: int = SIZE) -> Image.Image:
    """colour and background: names from COLOURS and BACKGROUNDS, or (r, g, b) tuples."""
    img = Image.new("RGB", (size, size), BACKGROUNDS.get(background, background))
    pen = ImageDraw.Draw(img)
    m = size // 5
    box = (m, m, size - m, size - m)
    fill = COLOURS.get(colour, colour)
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(size // 2, m), (size - m, size - m), (m, size - m)], fill=fill)
    return img


def caption(shape: str, colour: str, background: str) -> str:
    return f"a {colour} {shape} on a {background} background"


def base_model_images(size: int = SIZE) -> list[tuple[Image.Image, str]]:
    """What the demo base model learns from: every shape, colour and background except the concept colour."""
    return [(draw(shape, colour, bg, size), caption(shape, colour, bg))
            for colour in COLOURS if colour != CONCEPT_COLOUR for shape in SHAPES for bg in BACKGROUNDS]


def _write(out: Path, items) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for i, (shape, colour, background) in enumerate(items):
        name = f"{i:02d}_{colour}_{shape}"
        draw(shape, colour, background).save(out / f"{name}.png", optimize=True)
        (out / f"{name}.txt").write_text(caption(shape, colour, background) + "\n", encoding="utf-8")
    return out


def make_demo_dataset(out: Path) -> Path:
    return _write(out, DEMO)


def make_concept_dataset(out: Path) -> Path:
    return _write(out, [(shape, CONCEPT_COLOUR, bg) for shape, bg in CONCEPT])


# each demo shape recoloured: the edit pairs' instruction
RECOLOUR = {"red": "blue", "blue": "yellow", "yellow": "red", "green": "purple", "orange": "green",
            "purple": "orange", "white": "black", "black": "white"}


def make_demo_edit_pairs(out: Path) -> Path:
    """original/<name>.png (the control image) and edited/<name>.png + .txt (the instruction)."""
    for sub in ("original", "edited"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for i, (shape, colour, background) in enumerate(DEMO):
        name = f"{i:02d}_{colour}_{shape}"
        draw(shape, colour, background).save(out / "original" / f"{name}.png", optimize=True)
        draw(shape, RECOLOUR[colour], background).save(out / "edited" / f"{name}.png", optimize=True)
        (out / "edited" / f"{name}.txt").write_text(f"make the {colour} {shape} {RECOLOUR[colour]}\n",
                                                    encoding="utf-8")
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    kind = "concept" if "--concept" in args else "edit" if "--edit-pairs" in args else "demo"
    args = [a for a in args if a not in ("--concept", "--edit-pairs")]
    here = Path(__file__).resolve().parent
    default = {"concept": "demo_concept", "edit": "demo_edit_pairs", "demo": "demo_dataset"}[kind]
    target = Path(args[0]) if args else here / default
    make = {"concept": make_concept_dataset, "edit": make_demo_edit_pairs, "demo": make_demo_dataset}[kind]
    print(make(target))
