"""Validation loss on held-out images, comparable from one evaluation to the next.

    validator = make_validator(cfg, model, accelerator, run, weight_dtype, unet, text_encoders)
    validator.maybe_run(state)                   # after an optimizer step (validation.every_n_steps)
    validator.maybe_run(state, epoch_end=True)   # after an epoch (validation.every_n_epochs)
    validator.metrics()                          # {"validation_loss": last value} for checkpoint retention

Every evaluation sees the same images, the same timesteps and the same noise: each image is
scored at `validation.timesteps` fixed timesteps spread evenly over the training range, with
noise drawn by diffusion_loss.py's per-sample generator under a fixed epoch id that training never uses.
No augmentation (no flip, center crop, captions as written). A change in the number is a change
in the weights, nothing else. It is the training objective (diffusion_loss.py's diffusion_loss), so
validation and training losses are on one scale.

Images: validation.path (a separate folder), else those held out of the dataset by
validation.fraction or dataset.validation_every_nth (data/scan.py). Off by default: with
neither every_n_steps nor every_n_epochs set, nothing is scanned, loaded or computed.
On N processes the images are shared out and the sums all-reduced; every rank runs the same
number of forward passes (FSDP and ZeRO-3 need every rank in every forward).
"""
from __future__ import annotations

import logging
import math

import torch

from ..config import ConfigError, TrainConfig, rules
from ..config.rules import validation_enabled  # noqa: F401 (re-exported)
from ..run.contract import Event
from .sampling import eval_mode

LOG = logging.getLogger("trainer")
VALIDATION_EPOCH = 1_000_000  # the noise's epoch id: never a training epoch
METRIC = "validation_loss"




def fixed_timesteps(t_min: int, t_max: int, count: int) -> list[int]:
    """`count` timesteps at the centres of equal slices of [t_min, t_max) (distinct, ascending)."""
    span = t_max - t_min
    count = max(1, min(count, span))
    return [t_min + int((2 * i + 1) * span / (2 * count)) for i in range(count)]


def unaugmented(cfg: TrainConfig, path: str = "") -> TrainConfig:
    """The config the validation images are read with: no flip, center crop, captions as written
    (and, for a separate folder, that folder alone, without class images)."""
    v = cfg.model_copy(deep=True)
    ds = v.dataset
    ds.flip, ds.center_crop, ds.caption_dropout, ds.shuffle_tags, ds.tag_dropout = False, True, 0.0, False, 0.0
    for sub in ds.subsets:
        sub.flip, sub.center_crop, sub.caption_dropout, sub.shuffle_tags, sub.tag_dropout = \
            False, True, 0.0, False, 0.0
    if path:
        ds.path, ds.subsets, ds.class_path, ds.num_class_images = path, [], "", 0
        ds.validation_every_nth, v.validation.fraction = 0, 0.0
        ds.source, ds.metadata_path = "folders", ""
    ds.cache_latents = ds.cache_text_encoder_outputs = False
    return v


def validation_scan(cfg: TrainConfig):
    """The validation images (a DatasetScan without class images), or a ConfigError saying how
    to get some."""
    from dataclasses import replace
    from pathlib import Path
    from ..data import scan_dataset
    from ..config.paths import resolve_path
    val = rules.check(cfg, "validation").validation  # one source of images (config/rules.py)
    if val.path:
        folder = resolve_path(val.path)
        if not Path(folder).is_dir():
            raise ConfigError(f"validation.path: {folder} is not a folder")
        scan = scan_dataset(unaugmented(cfg, folder))
    else:
        scan = scan_dataset(unaugmented(cfg), split="validation")
    items = [item for item in scan.items if not item.is_class]
    return replace(scan, items=items, class_samples=0)


class Validator:
    """Computes, logs and remembers the validation loss (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, model=None, accelerator=None, run=None, weight_dtype=None, unet=None,
                 text_encoders: list | None = None):
        self.cfg, self.model, self.accelerator, self.run = cfg, model, accelerator, run
        self.weight_dtype, self.unet, self.text_encoders = weight_dtype, unet, text_encoders
        self.active = validation_enabled(cfg)
        self.history: list[tuple[int, float]] = []  # (step, loss)
        self._cache: dict[int, dict] = {}
        self._cfg_at: dict[int, TrainConfig] = {}
        self.last_step = -1
        if not self.active:
            return
        from ..data import TrainDataset
        from ..launch.plan import DataCounts
        scan = validation_scan(cfg)
        once = DataCounts(subsets=tuple((name, images, 1) for name, images, _ in scan.counts.subsets))
        self.dataset = TrainDataset(scan, unaugmented(cfg), counts=once)
        self.dataset.set_epoch(0)
        self.batches = self._batches(cfg.validation.batch_size or cfg.schedule.batch_size)
        self.timesteps = self._timesteps()
        LOG.info("validation: %d images%s, every %s", len(self.dataset),
                 f" × {len(self.timesteps)} fixed timesteps {self.timesteps}" if self.timesteps else "",
                 self._schedule_words())

    def _timesteps(self) -> list[int]:
        c = self.cfg
        return fixed_timesteps(c.loss.timestep_min, c.loss.timestep_max, c.validation.timesteps)

    def _schedule_words(self) -> str:
        v = self.cfg.validation
        parts = ([f"{v.every_n_steps} steps"] if v.every_n_steps else []) + \
                ([f"{v.every_n_epochs} epochs"] if v.every_n_epochs else [])
        return " and ".join(parts)

    def _batches(self, batch_size: int) -> list[list[int]]:
        """Dataset indices grouped by bucket (a batch holds one shape), in a fixed order."""
        by_bucket: dict[int, list[int]] = {}
        for index, bucket in enumerate(self.dataset.sample_buckets):
            by_bucket.setdefault(bucket, []).append(index)
        return [indices[i:i + batch_size] for _, indices in sorted(by_bucket.items())
                for i in range(0, len(indices), batch_size)]

    # ------------------------------------------------------------------ when

    def due(self, step: int, epoch_end: bool = False, epochs_done: int = 0) -> bool:
        v = self.cfg.validation
        if not self.active or step == self.last_step:
            return False
        if epoch_end:
            return bool(v.every_n_epochs and epochs_done % v.every_n_epochs == 0)
        return bool(v.every_n_steps and step % v.every_n_steps == 0)

    def maybe_run(self, state, epoch_end: bool = False) -> float | None:
        """Evaluate when due (state.epoch counts finished epochs at an epoch's end); emits a
        `validation` event and a TensorBoard scalar; returns the loss or None."""
        if not self.due(state.global_step, epoch_end, state.epoch):
            return None
        loss = self.evaluate()
        self.last_step = state.global_step
        self.history.append((state.global_step, loss))
        best = min(value for _, value in self.history)
        self.run.events.emit(Event.VALIDATION, step=state.global_step, epoch=state.epoch + (0 if epoch_end else 1),
                             loss=loss, best=best, images=len(self.dataset), timesteps=self.timesteps)
        self.run.events.scalars(state.global_step, validation_loss=loss)
        LOG.info("validation loss %.5f at step %d (best %.5f)", loss, state.global_step, best)
        return loss

    def metrics(self) -> dict[str, float]:
        """The latest validation loss as a checkpoint metric (empty before the first evaluation)."""
        return {METRIC: self.history[-1][1]} if self.history else {}

    # ------------------------------------------------------------------ how

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over every (image, fixed timestep) pair; the same value on every rank."""
        acc = self.accelerator
        n, rank = acc.num_processes, acc.process_index
        per_rank = math.ceil(len(self.batches) / n)
        total = torch.zeros(2, dtype=torch.float64)
        # no dropout: the same weights give the same number. Each submodule's own mode is
        # restored afterwards (m.train(True) on the top module would re-enable, and
        # m.train(False) disable, dropout layers that training had set otherwise).
        with eval_mode(self._modules()):
            for j in range(per_rank):
                b = j * n + rank
                weight = 1.0 if b < len(self.batches) else 0.0  # a padding forward keeps ranks in step
                number = min(b, len(self.batches) - 1)
                loss_sum, count = self._score(number, self.batches[number])
                total += torch.tensor([loss_sum * weight, count * weight], dtype=torch.float64)
        if n > 1:
            total = acc.reduce(total.to(acc.device), reduction="sum").cpu()
        return float(total[0] / total[1])

    def _modules(self) -> list[torch.nn.Module]:
        """What is put in eval mode (no dropout) during an evaluation."""
        return [self.unet, *(self.text_encoders or [])]

    def _score(self, number: int, indices: list[int]) -> tuple[float, int]:
        """(sum of losses, count) of batch `number` over the fixed timesteps."""
        from ..data.indexed import collate_with_index
        from .loss import diffusion_loss
        batch = self._batch(number, indices, collate_with_index)
        loss_sum = 0.0
        for k, t in enumerate(self.timesteps):
            loss = diffusion_loss(self.model, self.unet, batch, cfg=self._at_timestep(t), epoch=VALIDATION_EPOCH + k,
                                  device=self.accelerator.device, weight_dtype=self.weight_dtype,
                                  text_encoders=self.text_encoders)
            loss_sum += loss.item() * len(indices)
        return loss_sum, len(indices) * len(self.timesteps)

    def _batch(self, number: int, indices: list[int], collate) -> dict:
        """Batch `number` with its latents (posterior mean) and, while the text encoders are frozen,
        its text-encoder outputs: computed at the first evaluation, then reused, since neither changes
        during diffusion training. Every timestep and every later evaluation then costs UNet passes only."""
        if number in self._cache:
            return self._cache[number]
        from .loss import control_latents
        batch = collate([(i, self.dataset[i]) for i in indices])
        model, family, device = self.model, self.model.family, self.accelerator.device
        batch["latents"] = family.encode_latents(model, batch.pop("pixel_values").to(device), None).cpu()
        if "control_pixel_values" in batch:  # paired images: their control latents, as training reads them
            batch["control_latents"] = control_latents(model, batch.pop("control_pixel_values"), device).cpu()
        if not self.cfg.network.train_text_encoder:
            ids = family.tokenize_batch(model, batch, self.cfg.dataset.max_token_length)
            text = family.encode_text(model, [i.to(device) for i in ids], self.text_encoders)
            batch["text"] = {name: tensor.cpu() for name, tensor in text.items()}
        self._cache[number] = batch
        return batch

    def _at_timestep(self, t: int) -> TrainConfig:
        """The training config with its timestep range narrowed to [t, t + 1): the objective then draws
        exactly t, and the rest of the objective (noise offset, min-SNR, prediction type) is the same."""
        if t not in self._cfg_at:
            c = self.cfg.model_copy(deep=True)
            c.loss.timestep_min, c.loss.timestep_max = t, t + 1
            self._cfg_at[t] = c
        return self._cfg_at[t]


def make_validator(cfg: TrainConfig, model, accelerator, run, weight_dtype, unet, text_encoders) -> Validator:
    """A Validator; with validation off it does nothing (and loads nothing)."""
    rules.check(cfg, "validation")
    if not validation_enabled(cfg) and (cfg.validation.fraction or cfg.dataset.validation_every_nth):
        LOG.warning("validation: images are held out of training but never evaluated; set "
                    "validation.every_n_steps or validation.every_n_epochs (or stop holding them out)")
    return Validator(cfg, model, accelerator, run, weight_dtype, unet, text_encoders)
