"""BucketBatchSampler: what each rank trains per epoch (the plan's numbers are checked against it
in test_plan.py)."""
from __future__ import annotations

from collections import Counter

import pytest

from trainer_backend.data.sampler import BucketBatchSampler

# 3 buckets of 7, 4 and 5 samples, interleaved the way a scan of mixed images would give them
BUCKETS = [i % 3 for i in range(12)] + [0, 0, 0, 2]


def ranks(buckets, batch_size, n, seed=0, shuffle=True):
    return [BucketBatchSampler(buckets, batch_size, n, rank, seed, shuffle) for rank in range(n)]


def test_every_batch_comes_from_one_bucket():
    for sampler in ranks(BUCKETS, 2, 3):
        for batch in sampler.batches(0):
            assert len({BUCKETS[i] for i in batch}) == 1, batch


@pytest.mark.parametrize("batch_size,n", [(1, 1), (2, 1), (1, 2), (2, 3), (3, 4), (4, 8)])
def test_each_sample_once_per_epoch_across_ranks_and_same_batch_count(batch_size, n):
    samplers = ranks(BUCKETS, batch_size, n, seed=7)
    for epoch in range(3):
        per_rank = [s.batches(epoch) for s in samplers]
        assert len({len(b) for b in per_rank}) == 1, "every rank must run the same number of batches"
        assert all(len(b) == len(s) for b, s in zip(per_rank, samplers))
        seen = Counter(i for batches in per_rank for batch in batches for i in batch)
        assert set(seen) == set(range(len(BUCKETS))), "no sample may be skipped"
        if n == 1:
            assert all(c == 1 for c in seen.values())
        # step by step, ranks train batches of equal size (padding fills the short ones)
        for step in zip(*per_rank):
            assert len({len(batch) for batch in step}) == 1
            assert all(1 <= len(batch) <= batch_size for batch in step)


def test_padding_repeats_samples_of_the_same_global_batch_only():
    # one bucket of 5, global batch 2 × 4 = 8: one short global batch, ceil(5/4) = 2 per rank
    samplers = ranks([0] * 5, 2, 4, seed=3)
    per_rank = [s.batches(0) for s in samplers]
    assert [len(b) for b in per_rank] == [1, 1, 1, 1]
    flat = [i for batches in per_rank for i in batches[0]]
    assert len(flat) == 8 and set(flat) == set(range(5))


def test_n_processes_times_b_equals_one_process_times_n_b():
    """Same seed: 2 ranks × batch 1 train the same global batches, in the same order, as
    1 process × batch 2 (what a DDP equivalence test relies on)."""
    single = BucketBatchSampler(BUCKETS, 2, 1, 0, seed=11)
    two = ranks(BUCKETS, 1, 2, seed=11)
    for epoch in range(2):
        merged = [a + b for a, b in zip(two[0].batches(epoch), two[1].batches(epoch))]
        expected = [batch + batch if len(batch) == 1 else batch for batch in single.batches(epoch)]
        assert merged == expected


def test_order_is_seeded_and_changes_with_the_epoch():
    a = BucketBatchSampler(BUCKETS, 2, seed=5)
    b = BucketBatchSampler(BUCKETS, 2, seed=5)
    assert a.batches(4) == b.batches(4)
    assert a.batches(0) != a.batches(1)
    assert a.batches(0) != BucketBatchSampler(BUCKETS, 2, seed=6).batches(0)


def test_iter_follows_set_epoch_and_shuffle_off_keeps_dataset_order():
    s = BucketBatchSampler(BUCKETS, 3, seed=1)
    s.set_epoch(2)
    assert list(s) == s.batches(2)
    ordered = BucketBatchSampler([0] * 5 + [1] * 2, 2, shuffle=False)
    assert ordered.batches(0) == ordered.batches(9) == [[0, 1], [2, 3], [4], [5, 6]]


def test_bucket_sizes_by_bucket_id():
    assert BucketBatchSampler(BUCKETS, 1).bucket_sizes == (7, 4, 5)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="process_index"):
        BucketBatchSampler([0, 0], 1, num_processes=2, process_index=2)
    with pytest.raises(ValueError, match="batch_size"):
        BucketBatchSampler([0, 0], 0)


def test_works_as_a_torch_dataloader_batch_sampler():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader
    data = [torch.tensor([float(i)]) for i in range(len(BUCKETS))]
    sampler = BucketBatchSampler(BUCKETS, 2, num_processes=2, process_index=1, seed=0)
    sampler.set_epoch(1)
    loaded = [batch.flatten().long().tolist() for batch in DataLoader(data, batch_sampler=sampler)]
    assert loaded == sampler.batches(1)
