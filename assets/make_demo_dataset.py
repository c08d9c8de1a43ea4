"""Generate the built-in demo dataset: 8 small images of simple coloured shapes with captions,
and the demo edit pairs (assets/demo_edit_pairs: original/ control images, edited/ training images
whose captions are the edit instruction), for edit models such as Qwen-Image-Edit.

    python assets/make_demo_dataset.py [out_folder]     # default: assets/demo_dataset (+ demo_edit_pairs)

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
           "purple": (140, 60, 190), "orange": (245, 140, 30), "white": (245, 245, 245), "black": (20, 20, 20)}
BACKGROUNDS = {"light grey": (200, 200, 200), "dark blue": (20, 30, 70), "pale green": (200, 230, 200),
               "beige": (235, 220, 190)}
# (shape, colour, background) for each image
DEMO = [("circle", "red", "light grey"), ("square", "blue", "pale green"), ("triangle", "yellow", "dark blue"),
        ("circle", "green", "beige"), ("square", "orange", "dark blue"), ("triangle", "purple", "light grey"),
        ("circle", "white", "dark blue"), ("square", "black", "beige")]


def draw(shape: str, colour: str, background: str, size: int = SIZE) -> Image.Image:
    img = Image.new("RGB", (size, size), BACKGROUNDS[background])
    pen = ImageDraw.Draw(img)
    m = size // 5
    box = (m, m, size - m, size - m)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(size // 2, m), (size - m, size - m), (m, size - m)], fill=fill)
    return img


def make_demo_dataset(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for i, (shape, colour, background) in enumerate(DEMO):
        name = f"{i:02d}_{colour}_{shape}"
        draw(shape, colour, background).save(out / f"{name}.png", optimize=True)
        (out / f"{name}.txt").write_text(f"a {colour} {shape} on a {background} background\n", encoding="utf-8")
    return out


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
    here = Path(__file__).resolve().parent
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else here / "demo_dataset"
    print(make_demo_dataset(target))
    print(make_demo_edit_pairs(target.parent / "demo_edit_pairs"))
