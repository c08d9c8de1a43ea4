"""DreamBooth prior preservation: instance and class samples share each batch.

The dataset holds the instance samples (images × repeats) and the class samples of an epoch
(see data/). PairedBatchSampler orders each bucket so that instance and class samples alternate
in proportion before the bucket is cut into global batches, so every batch of two or more holds
both kinds (with batch 1, consecutive steps alternate; gradient accumulation then pairs them).
Batch counts, padding and the per-process split are the ones of BucketBatchSampler, which
plan.py counts: the plan is unchanged. The loss weights the class samples by
dataset.prior_loss_weight (diffusion_loss.py) and the step events carry both parts.
"""
from __future__ import annotations

import random

from ..data.sampler import BucketBatchSampler


def interleave(instance: list[int], class_: list[int]) -> list[int]:
    """Merge two lists spreading each evenly: element k of a list of n sits at (k + 0.5) / n."""
    keyed = [((k + 0.5) / len(instance), 0, x) for k, x in enumerate(instance)]
    keyed += [((k + 0.5) / len(class_), 1, x) for k, x in enumerate(class_)]
    return [x for _, _, x in sorted(keyed)]


class PairedBatchSampler(BucketBatchSampler):
    """BucketBatchSampler whose global batches mix instance and class samples evenly."""

    def __init__(self, sample_buckets, is_class: list[bool], batch_size: int, num_processes: int = 1,
                 process_index: int = 0, seed: int = 0, shuffle: bool = True) -> None:
        super().__init__(sample_buckets, batch_size, num_processes=num_processes, process_index=process_index,
                         seed=seed, shuffle=shuffle)
        self.is_class = list(is_class)

    def global_batches(self, epoch: int) -> list[list[int]]:
        rng = random.Random(f"paired-batch-sampler:{self.seed}:{epoch}")
        size = self.global_batch_size
        batches: list[list[int]] = []
        for _, indices in self._buckets:
            instance = [i for i in indices if not self.is_class[i]]
            class_ = [i for i in indices if self.is_class[i]]
            if self.shuffle:
                rng.shuffle(instance)
                rng.shuffle(class_)
            order = interleave(instance, class_)
            batches.extend(order[start:start + size] for start in range(0, len(order), size))
        if self.shuffle:
            rng.shuffle(batches)
        return batches


def batch_sampler(dataset, batch_size: int, *, num_processes: int = 1, process_index: int = 0,
                  seed: int = 0) -> BucketBatchSampler:
    """The loop's batch sampler: paired when the dataset has class samples."""
    is_class = [dataset.items[k].is_class for k in dataset.sample_items]
    if any(is_class):
        return PairedBatchSampler(dataset.sample_buckets, is_class, batch_size, num_processes=num_processes,
                                  process_index=process_index, seed=seed)
    return BucketBatchSampler(dataset.sample_buckets, batch_size, num_processes=num_processes,
                              process_index=process_index, seed=seed)
