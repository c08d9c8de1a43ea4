"""Each epoch's DataLoader, the next one's worker processes started while this epoch trains.

A loader per epoch keeps an epoch's batches, its private generator and a resume's skip simple; but
with worker processes (dataset.num_workers, automatic on a GPU) a fresh loader at every epoch
boundary waited for its workers to start and decode the first images: on an H200, SDXL LoRA with
4 images an epoch took ~1.5 s every 4th step against ~0.7 s (docs/performance.md "Measured on a GPU"). Here the
next epoch's loader is started as soon as an epoch starts, so its workers are up and have prefetched
by the time it is needed. In-process loading (no workers) is unchanged: nothing to start early.
"""
from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader

from ..data.indexed import IndexedDataset, collate_with_index, loader_workers
from ..compute.devices import device_kind


class EpochLoaders:
    def __init__(self, cfg, dataset, sampler, epochs: int, device="cpu", num_processes: int = 1,
                 start_ahead: bool = True):
        self.cfg, self.dataset, self.sampler, self.epochs = cfg, dataset, sampler, epochs
        self.workers = loader_workers(cfg.dataset.num_workers, device_kind(device) != "cpu",
                                      cfg.dataset.cache_latents, num_processes, os.cpu_count())
        self.start_ahead = start_ahead and self.workers > 0
        self.ahead = None  # (epoch, its started iterator)

    def epoch(self, epoch: int, skip: int = 0):
        """This process's batches of `epoch`, after the first `skip` (trained before a resume)."""
        self.dataset.set_epoch(epoch)  # the in-process view; workers get the epoch with each sample
        if self.ahead is not None and self.ahead[0] == epoch and skip == 0:
            batches = self.ahead[1]
        else:
            batches = iter(self.loader(epoch, skip))
        self.ahead = None
        if self.start_ahead and epoch + 1 < self.epochs:
            self.ahead = (epoch + 1, iter(self.loader(epoch + 1)))  # forks its workers; they prefetch
        return batches

    def loader(self, epoch: int, skip: int = 0) -> DataLoader:
        """The loader gets a private generator: creating its iterator must not draw from the global
        RNG, whose state (adapter dropout) a resume restores as it was at the checkpoint."""
        return DataLoader(IndexedDataset(self.dataset, epoch), batch_sampler=self.sampler.batches(epoch)[skip:],
                          collate_fn=collate_with_index, num_workers=self.workers,
                          generator=torch.Generator().manual_seed(self.cfg.schedule.seed + epoch))

    def close(self) -> None:
        """End the started-ahead workers (a stop or the last step can leave them waiting)."""
        self.ahead = None
