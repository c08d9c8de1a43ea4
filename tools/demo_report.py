"""Did the demo learn? Loss and sample colour of a finished demo run, before vs after.

    .venv/bin/python tools/demo_report.py runs/demo-sd1-lora

Reads the run's events.jsonl and its samples: the loss (mean of the first and the last
`window` optimizer steps) and, for each sample prompt, the distance in RGB (0-255 per channel)
between the mean colour of the image's centre (where the demo's circles and squares are) and
the taught colour (pink, assets/make_demo_dataset.py), in the samples before the first step and
at the last sampled step, and the mean distance at every sampled step. Prints one JSON object.
Standard library + Pillow + numpy only.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def concept_colour() -> tuple[int, int, int]:
    spec = importlib.util.spec_from_file_location("make_demo_dataset", ROOT / "assets" / "make_demo_dataset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.COLOURS[module.CONCEPT_COLOUR]


def centre_colour(path: Path) -> np.ndarray:
    """Mean RGB of the middle 28 % of the image: inside both the demo's circle and its square."""
    img = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64)
    h, w = img.shape[:2]
    return img[int(h * 0.36):int(h * 0.64), int(w * 0.36):int(w * 0.64)].reshape(-1, 3).mean(axis=0)


def demo_report(run_dir: str | Path, window: int = 20) -> dict:
    run = Path(run_dir)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    losses = [e["loss"] for e in events if e["event"] == "step"]
    samples = [e for e in events if e["event"] == "sample"]
    if len(losses) < 2 or len(samples) < 2:
        raise SystemExit(f"{run}: needs a finished run with samples before and after training")
    n = max(1, min(window, len(losses) // 2))
    target = np.array(concept_colour(), dtype=np.float64)
    first, last = samples[0], samples[-1]
    rows = []
    for i, prompt in enumerate(first["prompts"]):
        before, after = centre_colour(Path(first["paths"][i])), centre_colour(Path(last["paths"][i]))
        rows.append({"prompt": prompt, "centre_rgb_before": [round(v) for v in before],
                     "centre_rgb_after": [round(v) for v in after],
                     "distance_before": round(float(np.linalg.norm(before - target)), 1),
                     "distance_after": round(float(np.linalg.norm(after - target)), 1)})
    return {"steps": len(losses), "loss_first": round(float(np.mean(losses[:n])), 4),
            "loss_last": round(float(np.mean(losses[-n:])), 4), "loss_window": n,
            "samples_before_step": first["step"], "samples_after_step": last["step"],
            "target_rgb": [int(v) for v in target],
            "mean_distance_before": round(float(np.mean([r["distance_before"] for r in rows])), 1),
            "mean_distance_after": round(float(np.mean([r["distance_after"] for r in rows])), 1),
            # every sample round, so a middle one shows the colour on its way
            "mean_distance_by_step": {s["step"]: round(float(np.mean(
                [np.linalg.norm(centre_colour(Path(path)) - target) for path in s["paths"]])), 1) for s in samples},
            "prompts": rows}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[1])
    print(json.dumps(demo_report(sys.argv[1]), indent=2))
