"""DreamBooth class (regularization) images: generate the missing ones before training.

With dataset.num_class_images = N and fewer than N images in dataset.class_path (or none), the
base model generates the rest from dataset.class_prompt on the main process, in batches, image i
from its own seed (i), into a cache outside the dataset:
`<dataset.cache_dir or output.dir/.cache>/class_images/<key>/class-00000.png`, where the key
hashes everything the images depend on (model, prompts, size, steps, guidance, sampler). A later
run with the same settings reuses them; a run that needs more generates only the new indices.
The run then trains on `<run>/class_images/`: links to the user's class images plus the
generated ones (the dataset and the user's class folder are never written to).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import torch

from ..config import ConfigError, TrainConfig
from ..families.weights_identity import weights_identity
from ..run.contract import Event

LOG = logging.getLogger("trainer")
CLASS_FORMAT = 1          # bump when generation changes in a way the key does not capture
SAMPLER = "euler"


def class_image_name(index: int) -> str:
    return f"class-{index:05d}.png"


def class_seed(index: int) -> int:
    return index


def user_class_images(class_path: str) -> list[Path]:
    """Image files already in dataset.class_path (none when it is empty or does not exist)."""
    if not class_path or not Path(class_path).expanduser().is_dir():
        return []
    from ..data.subsets import walk_images
    return walk_images(Path(class_path).expanduser(), [])


def class_cache_dir(cfg: TrainConfig, model) -> Path:
    """Folder of generated class images for these settings (outside the dataset)."""
    ds = cfg.dataset
    parts = [str(CLASS_FORMAT), weights_identity(model.source), weights_identity(cfg.model.vae),
             model.prediction_type, ds.class_prompt, ds.class_negative_prompt, str(ds.resolution),
             str(ds.class_generation_steps), repr(ds.class_guidance_scale), SAMPLER]
    if model.clip_skip > 1:  # other conditioning, other images (the key of clip_skip 1 stays as it was)
        parts.append(f"clip_skip={model.clip_skip}")
    key = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:20]
    base = Path(ds.cache_dir).expanduser() if ds.cache_dir else Path(cfg.output.dir) / ".cache"
    return base / "class_images" / key


def generate_class_images(model, indices: list[int], folder: Path, cfg: TrainConfig, device: torch.device,
                          weight_dtype: torch.dtype, progress: bool = True) -> None:
    """Generate class images `indices` into folder (batched; each image from its own seed)."""
    from tqdm.auto import tqdm
    from ..diffusion.sampling import eval_mode, generate, preserved_rng, sampling_parts, save_png
    ds = cfg.dataset
    folder.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(indices), desc="class images", unit="img", disable=not progress)
    # the global RNG is left as it was: generating (or reusing) class images never changes training
    with preserved_rng(), eval_mode([model.denoiser, *model.text_encoders]), torch.no_grad(), sampling_parts(model):
        pipe = model.family.build_pipeline(model, SAMPLER)
        for start in range(0, len(indices), ds.class_generation_batch_size):
            chunk = indices[start:start + ds.class_generation_batch_size]
            negative = [ds.class_negative_prompt] * len(chunk) if ds.class_negative_prompt else None
            prompts = model.family.prompt_arguments(model, [ds.class_prompt] * len(chunk), negative)
            images = generate(pipe, device, weight_dtype, **prompts, width=ds.resolution, height=ds.resolution,
                              num_inference_steps=ds.class_generation_steps,
                              **model.family.guidance_arguments(model, ds.class_guidance_scale),
                              generator=[torch.Generator("cpu").manual_seed(class_seed(i)) for i in chunk],
                              **model.family.pipeline_call_options(model))
            for i, image in zip(chunk, images):
                save_png(image, folder / class_image_name(i))
            bar.update(len(chunk))
    bar.close()


def _link(src: Path, dst: Path) -> None:
    try:
        os.symlink(src.resolve(), dst)
    except OSError:  # no symlinks here (some filesystems): a hard link, else a copy
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def build_view(view: Path, user: list[Path], generated: list[Path]) -> None:
    """<run>/class_images: links to the user's class images and the generated ones, rebuilt each run."""
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    for i, src in enumerate(user):
        _link(src, view / f"user-{i:05d}{src.suffix.lower()}")
    for i, src in enumerate(generated):
        _link(src, view / f"gen-{i:05d}.png")


def _dataset_roots(cfg: TrainConfig) -> list[Path]:
    paths = [cfg.dataset.path, *(s.path for s in cfg.dataset.subsets)]
    return [Path(p).expanduser() for p in paths if p and Path(p).expanduser().exists()]


def prepare_class_images(cfg: TrainConfig, model, accelerator, run, weight_dtype: torch.dtype,
                         place_denoiser=None) -> TrainConfig:
    """Make sure num_class_images class images exist; returns the config to train with (its
    dataset.class_path points at the run's class-image folder when images were added).
    place_denoiser: called before generating (the loop places the denoiser only after the caches)."""
    from ..data.cache import check_outside
    ds = cfg.dataset
    if ds.num_class_images == 0:
        return cfg
    user = user_class_images(ds.class_path)
    wanted = ds.num_class_images
    if len(user) >= wanted:
        LOG.info("class images: %d in %s (dataset.num_class_images = %d): none to generate", len(user),
                 ds.class_path, wanted)
        return cfg
    if not ds.class_prompt.strip():
        raise ConfigError(f"dataset.class_prompt: required to generate class images (dataset.num_class_images = "
                          f"{wanted}, {len(user)} found in dataset.class_path)")
    cache = class_cache_dir(cfg, model)
    view = Path(run.dir) / "class_images"
    count = wanted - len(user)
    if accelerator.is_main_process:
        check_outside(cache, _dataset_roots(cfg))
        todo = [i for i in range(count) if not (cache / class_image_name(i)).is_file()]
        LOG.info("class images: %d wanted, %d in dataset.class_path, %d cached in %s, %d to generate", wanted,
                 len(user), count - len(todo), cache, len(todo))
        if todo:
            if place_denoiser is not None:
                place_denoiser()
            generate_class_images(model, todo, cache, cfg, accelerator.device, weight_dtype, progress=True)
            (cache / "settings.json").write_text(json.dumps(
                {"prompt": ds.class_prompt, "negative_prompt": ds.class_negative_prompt, "model": model.source,
                 "resolution": ds.resolution, "steps": ds.class_generation_steps,
                 "guidance_scale": ds.class_guidance_scale, "sampler": SAMPLER, "seed_of_image_i": "i"}, indent=1))
        build_view(view, user, [cache / class_image_name(i) for i in range(count)])
        run.events.emit(Event.CLASS_IMAGES, folder=str(cache), wanted=wanted, user=len(user),
                        reused=count - len(todo), generated=len(todo))
    accelerator.wait_for_everyone()
    return cfg.model_copy(update={"dataset": ds.model_copy(update={"class_path": str(view)})})
