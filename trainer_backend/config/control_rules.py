"""The rules of paired control images (dataset.control_path and each subset's control_path; config/rules.py
runs them with the others): a family that takes no control image refuses a control folder, an edit model
(control_images = "required") refuses a dataset without one, and a batch never mixes paired and unpaired
images (a folder without control images beside paired ones is refused, except for a model that generates
and edits, control_images = "optional": its unpaired images train on their captions, in batches of their
own). Pure (no file system: config/checks.py checks that the folders exist). `control_problems` is also
what the trainer runs once an `auto` model has loaded and its family is known (methods/__init__.py)."""
from __future__ import annotations

from typing import Callable, Iterator

from .base import Problem
from .schema import TrainConfig

RULES: list[tuple[str, Callable[[TrainConfig], Iterator[Problem]]]] = []   # (group, rule)


def control_sources(cfg: TrainConfig) -> list[tuple[str, str]]:
    """(config key, control folder or "") of every folder of training images: dataset.path's, then each
    subset's. Class images (prior preservation) are never paired."""
    ds = cfg.dataset
    found = [("dataset.control_path", ds.control_path)] if ds.path or ds.control_path else []
    return found + [(f"dataset.subsets[{i}].control_path", s.control_path) for i, s in enumerate(ds.subsets)]


def uses_control(cfg: TrainConfig) -> bool:
    """Is any folder of training images paired with control images?"""
    return any(value for _, value in control_sources(cfg))


def control_problems(cfg: TrainConfig, mode: str | None, arch: str) -> Iterator[Problem]:
    """Problems of the control folders for a family whose Family.control_images is `mode` ("" = takes
    none, "optional", "required"; None = not known yet: model.arch = auto)."""
    if cfg.network.type == "vae":
        for key, value in control_sources(cfg):
            if value:
                yield Problem(key, "a VAE run trains the autoencoder on the images alone; leave it empty")
        return
    sources, used = control_sources(cfg), uses_control(cfg)
    if mode == "":
        for key, value in sources:
            if value:
                yield Problem(key, f"{arch} (model.arch) takes no control images; leave it empty (control images "
                                   f"are for edit models)")
        return
    for key, value in sources:
        if value:
            continue
        if mode == "required":
            yield Problem(key, f"{arch} (model.arch) is an edit model and trains on pairs: set the folder of control "
                               f"images (one per training image, matched by file name)")
        elif used and mode not in ("optional", None):  # None (model.arch = auto): rechecked once the model loads
            yield Problem(key, "the other image folders are paired with control images; set this folder's too "
                               "(a batch cannot mix paired and unpaired images)")
    if not (used or mode == "required"):
        return
    ds = cfg.dataset
    if ds.class_path or ds.num_class_images:
        key = "dataset.class_path" if ds.class_path else "dataset.num_class_images"
        yield Problem(key, "prior preservation cannot be combined with paired control images (class images have "
                           "no control image); leave it empty")
    if cfg.validation.path:
        yield Problem("validation.path", "with paired control images, hold validation images out of the dataset "
                                         "(validation.fraction or dataset.validation_every_nth) so each keeps its "
                                         "control image")


def family_control_mode(arch: str) -> str | None:
    """The registered family's control_images ("" / "optional" / "required"); None for auto."""
    if arch == "auto":
        return None
    from ..families.registry import entry  # pure (no torch)
    return entry(arch).control_images


def _rule(group: str):
    def register(fn):
        RULES.append((group, fn))
        return fn
    return register


@_rule("control")
def _control_folders(cfg: TrainConfig) -> Iterator[Problem]:
    yield from control_problems(cfg, family_control_mode(cfg.model.arch), cfg.model.arch)


@_rule("control")
def _control_prompts(cfg: TrainConfig) -> Iterator[Problem]:
    """Inline sample prompts and the family's control images (the prompt file: config/checks.py)."""
    from .sample_prompts import control_line_problems
    if cfg.network.type == "vae":
        return
    mode = family_control_mode(cfg.model.arch)
    yield from (Problem(key, message) for key, message in
                control_line_problems(cfg, "samples.prompts", cfg.samples.prompts, mode, cfg.model.arch))
