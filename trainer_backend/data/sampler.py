"""Per-process batches of dataset indices: bucket-pure, seeded, identical in count on every rank.

One epoch, for every process alike (each computes the same global order from the seed):
1. group sample indices by bucket id and shuffle each bucket (seeded by seed and epoch);
2. cut each bucket into GLOBAL batches of batch_size × num_processes (a bucket's last one may be short);
3. shuffle the order of all global batches (seeded);
4. each process takes its slice of every global batch. A short global batch of L samples gives every
   process ceil(L / N) samples, padding by repeating samples of that same global batch, so all ranks
   run the same number of forward/backward passes (DDP would hang otherwise).

Because the global batch is cut before it is split, N processes × batch b see exactly the same
global batches, in the same order, as 1 process × batch N·b (same seed): the basis of DDP
equivalence tests. plan.py counts batches and padding with the same rules.

Pure Python (random.Random with a string seed, which is hashed with SHA-512 and so does not
depend on PYTHONHASHSEED). Usable as a torch DataLoader `batch_sampler`.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence


class BucketBatchSampler:
    """This process's batches of dataset indices, one epoch at a time."""

    def __init__(self, sample_buckets: Sequence[int], batch_size: int, num_processes: int = 1,
                 process_index: int = 0, seed: int = 0, shuffle: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        if num_processes < 1:
            raise ValueError(f"num_processes must be ≥ 1, got {num_processes}")
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index must be in 0..{num_processes - 1}, got {process_index}")
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        groups: dict[int, list[int]] = {}
        for index, bucket in enumerate(sample_buckets):
            groups.setdefault(int(bucket), []).append(index)
        # Sorted by bucket id so the order never depends on the dataset's iteration order.
        self._buckets: list[tuple[int, list[int]]] = sorted(groups.items())

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.num_processes

    @property
    def bucket_sizes(self) -> tuple[int, ...]:
        """Samples per bucket (ordered by bucket id): what plan.DataCounts.bucket_sizes expects."""
        return tuple(len(indices) for _, indices in self._buckets)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_batches(self, epoch: int) -> list[list[int]]:
        """The epoch's global batches (before splitting across processes), same on every rank."""
        rng = random.Random(f"bucket-batch-sampler:{self.seed}:{epoch}")
        size = self.global_batch_size
        batches: list[list[int]] = []
        for _, indices in self._buckets:
            order = list(indices)
            if self.shuffle:
                rng.shuffle(order)
            batches.extend(order[start:start + size] for start in range(0, len(order), size))
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def batches(self, epoch: int) -> list[list[int]]:
        """This process's batches for `epoch`; deterministic in (seed, epoch, process_index)."""
        n, rank = self.num_processes, self.process_index
        out = []
        for batch in self.global_batches(epoch):
            per_process = math.ceil(len(batch) / n)
            padded = [batch[i % len(batch)] for i in range(per_process * n)]
            out.append(padded[rank * per_process:(rank + 1) * per_process])
        return out

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches(self.epoch))

    def __len__(self) -> int:
        size = self.global_batch_size
        return sum(math.ceil(len(indices) / size) for _, indices in self._buckets)
