"""Catch an adapter that learned nothing: at each sample round and at the end, the same prompt and seed
with and without the adapter, the mean absolute difference of the two images, and the norm of what the
adapter adds to the weights (LoRA's B starts at zero). A final effect near zero, a NaN, or a sample that is
one flat colour becomes a `warning` event (the Run page and the webhooks show it), never a silent success.

The arithmetic and the verdict are pure functions (tested with hypothesis); AdapterEffect keeps the base
images (the adapter switched off renders the same base image all run long, so each prompt's is made once).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# mean |with − without| over the pixels on a 0..1 scale. 8-bit images quantize to 1/255, so below 0.02/255 fewer
# than one pixel value in fifty moved by one level: nothing a user could see. (The tiny test models' LoRAs after
# 3 steps at lr 1e-2 measure 0.04/255 (Flux.2) to 15/255 (SD3); lr 1e-12 measures exactly 0.)
EFFECT_FLOOR = 0.02 / 255
CONSTANT_SPREAD = 1.0 / 255  # max − min of a sample below one 8-bit level: a flat (all black) picture


@dataclass(frozen=True)
class Finding:
    cause: str     # "no_effect" | "not_finite" | "constant_image"
    message: str


def image_array(image) -> np.ndarray:
    """A PIL image or uint8 array as float64 H×W×C in 0..1 (a float array is taken as already 0..1)."""
    array = np.asarray(image)
    return array.astype(np.float64) / 255.0 if array.dtype == np.uint8 else array.astype(np.float64)


def mean_abs_difference(a, b) -> float:
    """Mean absolute pixel difference of two same-size images on a 0..1 scale (NaN if either has NaN)."""
    x, y = image_array(a), image_array(b)
    if x.shape != y.shape:
        raise ValueError(f"images differ in size: {x.shape} vs {y.shape}")
    return float(np.abs(x - y).mean())


def is_flat(image) -> bool:
    """One colour everywhere (an all-black picture from a NaN in the model is the common one)."""
    x = image_array(image)
    return bool(x.size == 0 or not np.isfinite(x).all() or float(x.max() - x.min()) < CONSTANT_SPREAD)


def findings(effect: float | None, norm: float | None, flat: bool, step: int, final: bool) -> list[Finding]:
    """What to warn about after one measurement. At a sample round only broken numbers or pictures are
    warnings (an early adapter may rightly change little); at the end a near-zero effect is one too."""
    out = []
    numbers = [v for v in (effect, norm) if v is not None]
    if any(not math.isfinite(v) for v in numbers):
        out.append(Finding("not_finite", f"step {step}: the adapter's weights or its sample are NaN/inf: the run "
                                         "diverged (fp16 overflows easily: use bf16; or lower optimizer.lr)"))
    if flat:
        out.append(Finding("constant_image", f"step {step}: the sample is one flat colour (all black?): the model's "
                                             "output is broken (NaN in fp16: use bf16; or lower optimizer.lr)"))
    if final and not out and effect is not None and effect < EFFECT_FLOOR:
        out.append(Finding("no_effect", f"the LoRA barely changes the output (mean image difference {effect:.2g} "
                                        f"with vs without it, weight norm {norm if norm is not None else 0:.2g}): "
                                        "learning rate too low or targets wrong?"))
    return out


class AdapterEffect:
    """Measures one sample round: `render(prompt_index, adapter_on)` draws an image; base images are cached."""

    def __init__(self, probe_modules: list, disabled, delta_norm):
        self.modules, self._disabled, self._delta_norm = probe_modules, disabled, delta_norm
        self.base_images: dict[int, object] = {}

    def base_image(self, index: int, render):
        if index not in self.base_images:
            with self._disabled(self.modules):
                self.base_images[index] = render()
        return self.base_images[index]

    def measure(self, images: dict[int, object], render_base) -> tuple[float, float]:
        """(mean difference over the prompts, delta norm); render_base(i) draws prompt i without the adapter."""
        diffs = [mean_abs_difference(img, self.base_image(i, lambda i=i: render_base(i))) for i, img in images.items()]
        return float(np.mean(diffs)) if diffs else float("nan"), self._delta_norm(self.modules)


def make_adapter_effect(modules: list, switch) -> AdapterEffect | None:
    """The check for an adapter run; switch: methods.adapter_switch(trainable), None for a full fine-tune or
    a VAE (there is no "without" to compare with). The loop hands it over: training/ never imports methods/."""
    if switch is None:
        return None
    disabled, delta_norm = switch
    return AdapterEffect(list(modules), disabled, delta_norm)
