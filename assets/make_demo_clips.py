"""Generate the built-in video demo dataset: short clips of the demo's coloured shapes sliding over their
backgrounds, with captions (presets/demo-wan22-lora.toml trains tiny Wan 2.2 on them on the CPU).

    python assets/make_demo_clips.py [out_folder]             # default: assets/demo_clips

Eight mp4 clips (17 frames at 16 fps, 64x64, the 4k+1 frames Wan takes), one per demo shape
(make_demo_dataset.DEMO), each with a `.txt` caption naming the shape, colour, motion and background.
Deterministic input frames; a few KB per clip.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from make_demo_dataset import BACKGROUNDS, DEMO, draw  # noqa: E402

SIZE, FRAMES, FPS = 64, 17, 16
MOTIONS = ("slides right", "slides left", "falls", "rises")


def clip_frames(shape: str, colour: str, background: str, motion: str) -> np.ndarray:
    """(FRAMES, SIZE, SIZE, 3) uint8: the shape (half the frame's size) moving across the background."""
    sprite = draw(shape, colour, background, size=SIZE // 2)
    travel = SIZE - SIZE // 2
    frames = []
    for f in range(FRAMES):
        step = round(f * travel / (FRAMES - 1))
        x, y = {"slides right": (step, SIZE // 4), "slides left": (travel - step, SIZE // 4),
                "falls": (SIZE // 4, step), "rises": (SIZE // 4, travel - step)}[motion]
        canvas = Image.new("RGB", (SIZE, SIZE), BACKGROUNDS[background])
        canvas.paste(sprite, (x, y))
        frames.append(np.asarray(canvas))
    return np.stack(frames)


def make_demo_clips(out: Path) -> Path:
    from trainer_backend.data.video import write_clip
    out.mkdir(parents=True, exist_ok=True)
    for i, (shape, colour, background) in enumerate(DEMO):
        motion = MOTIONS[i % len(MOTIONS)]
        name = f"{i:02d}_{colour}_{shape}"
        write_clip(out / f"{name}.mp4", clip_frames(shape, colour, background, motion), fps=FPS)
        (out / f"{name}.txt").write_text(f"a {colour} {shape} {motion} on a {background} background\n",
                                         encoding="utf-8")
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "demo_clips"
    print(make_demo_clips(target))
