"""The step plan: the policies' promises, the worked examples users reported, and the numbers
checked against what the real sampler yields."""
from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from trainer_backend.config import from_dict
from trainer_backend.data.sampler import BucketBatchSampler
from trainer_backend.launch.plan import DataCounts, format_plan_table, make_plan, plan_from_config

PR_1374 = DataCounts(subsets=(("1_ohwx man", 15, 1),))   # 15 images, 1 repeat (sd-scripts PR #1374)


def plan(counts, n, *, epochs=1, max_steps=0, batch_size=1, grad_accum=1, **kw):
    return make_plan(counts, batch_size=batch_size, grad_accum=grad_accum, epochs=epochs, max_steps=max_steps,
                     num_processes=n, **kw)


# ----------------------------------------------------------------------------- worked examples

def test_pr_1374_a_step_length_planned_on_one_gpu_is_divided_by_the_gpus():
    """kohya's GUI turned 60 epochs into max_train_steps = 900 on 1 GPU; on 4 GPUs each step
    trains 4 images (ceil(15/4) = 4 steps per epoch), so 900 steps became 225 epochs."""
    p = plan(PR_1374, 4, max_steps=900)
    assert (p.single.steps_per_epoch, p.single.epochs, p.single.total_steps) == (15, 60, 900)
    assert (p.multi.steps_per_epoch, p.multi.total_steps) == (4, 225)
    assert p.multi.epochs == 57                       # 56 full epochs of 4 steps + 1 step
    assert p.multi.total_samples_seen == p.single.total_samples_seen == 900
    assert p.multi.padding_per_epoch == 1             # 15 samples → 4 ranks × 4
    assert "900" in p.adjustment and "225" in p.adjustment
    assert any("padded" in w for w in p.warnings)


def test_pr_1374_same_steps_reproduces_the_225_epochs_and_says_so():
    p = plan(PR_1374, 4, max_steps=900, policy="same_steps")
    assert (p.multi.total_steps, p.multi.epochs) == (900, 225)
    assert p.multi.total_samples_seen == 4 * 900
    assert "225 epochs" in p.adjustment and "3600" in p.adjustment


def test_pr_1374_a_length_in_epochs_keeps_60_epochs():
    p = plan(PR_1374, 4, epochs=60)
    assert (p.multi.epochs, p.multi.steps_per_epoch, p.multi.total_steps) == (60, 4, 240)
    # every image trained 60 times, plus the one stated padding sample per epoch
    assert p.multi.total_samples_seen == 60 * 15 + 60 * p.multi.padding_per_epoch


def test_seed_article_halved_repeats_by_hand_is_keep_steps_per_epoch():
    """13 photos × 40 repeats on 2 GPUs: the article prepared the data with half the repeats."""
    counts = DataCounts(subsets=(("40_photo", 13, 40),))
    p = plan(counts, 2, epochs=1, keep_steps_per_epoch=True)
    assert p.multi_repeats() == {"40_photo": 20}
    assert (p.multi.samples_per_epoch, p.multi.steps_per_epoch, p.multi.epochs) == (260, 130, 2)
    assert p.multi.total_samples_seen == p.single.total_samples_seen == 520
    assert "40 → 20" in p.adjustment


def test_keep_steps_per_epoch_states_rounding_and_cannot_go_below_one_repeat():
    counts = DataCounts(subsets=(("a", 10, 3), ("b", 5, 1)))
    p = plan(counts, 2, epochs=4, keep_steps_per_epoch=True)
    assert p.multi_repeats() == {"a": 2, "b": 1}
    assert any("3 ÷ 2" in w for w in p.warnings)
    q = plan(DataCounts(subsets=(("c", 8, 1),)), 4, epochs=3, keep_steps_per_epoch=True)
    assert q.multi.epochs == 3 and q.multi_repeats() == {"c": 1}
    assert any("cannot be divided" in w for w in q.warnings)


def test_one_process_has_no_adjustment():
    p = plan(PR_1374, 1, epochs=3, lr=1e-4, lr_scaling="linear")
    assert p.multi == p.single and p.adjustment == "" and p.warnings == []


@pytest.mark.parametrize("scaling", ["none", "linear", "sqrt"])
def test_lr_scaling_follows_the_effective_batch(scaling):
    p = plan(PR_1374, 4, epochs=2, batch_size=2, lr=1e-4, lr_scaling=scaling)
    assert (p.single.effective_batch, p.multi.effective_batch) == (2, 8)
    assert p.multi.lr == pytest.approx(1e-4 * {"none": 1, "linear": 4, "sqrt": 2}[scaling])
    assert p.single.lr == 1e-4
    assert p.lr_factor == pytest.approx(p.multi.lr / p.single.lr)   # what the trainer applies to every group
    assert ("learning rate scaled" in p.adjustment) == (scaling != "none")


def test_warmup_keeps_its_share_of_the_run():
    p = plan(PR_1374, 4, max_steps=900, warmup_steps=100)
    assert p.multi.warmup_steps == 25
    assert plan(PR_1374, 4, max_steps=900, warmup_steps=100, policy="same_steps").multi.warmup_steps == 100


def test_buckets_round_up_separately():
    # 3 buckets of 5 on 2 GPUs × batch 2: 2 batches each (not ceil(15/4) = 4)
    p = plan(DataCounts(subsets=(("a", 15, 1),), bucket_sizes=(5, 5, 5)), 2, epochs=1, batch_size=2)
    assert p.multi.batches_per_process_per_epoch == 6
    assert p.multi.padding_per_epoch == 3


def test_bad_counts_are_rejected():
    with pytest.raises(ValueError, match="bucket_sizes"):
        plan(DataCounts(subsets=(("a", 4, 1),), bucket_sizes=(1, 2)), 2)
    with pytest.raises(ValueError, match="no training samples"):
        plan(DataCounts(subsets=(("a", 0, 1),)), 2)


def test_to_dict_is_the_json_plan_event_and_the_table_shows_both_columns():
    p = plan(PR_1374, 4, max_steps=900)
    event = json.loads(json.dumps(p.to_dict()))
    assert event["multi"]["total_steps"] == 225 and event["single"]["total_steps"] == 900
    assert event["num_processes"] == 4 and event["subsets"][0]["repeats"] == 1
    table = format_plan_table(p)
    assert "1 GPU" in table and "4 GPUs" in table and p.adjustment in table
    steps_row = next(line for line in table.splitlines() if "total optimizer steps" in line)
    assert steps_row.split()[-2:] == ["900", "225"]


def test_plan_from_config_counts_every_machine():
    cfg = from_dict({"schedule": {"batch_size": 2, "max_steps": 100},
                     "hardware": {"num_processes": 2, "num_machines": 2, "main_process_ip": "10.0.0.1",
                                  "lr_scaling": "linear"},
                     "optimizer": {"lr": 1e-4}})
    p = plan_from_config(cfg, PR_1374)
    assert p.num_processes == 4 and p.multi.total_steps == 25
    assert p.multi.lr == pytest.approx(4e-4)
    assert plan_from_config(cfg, PR_1374, num_processes=1).multi.total_steps == 100


# ----------------------------------------------------------------------------- properties

subsets_st = st.lists(st.tuples(st.integers(1, 12), st.integers(1, 4)), min_size=1, max_size=3)


@st.composite
def datasets(draw):
    subsets = tuple((f"s{i}", images, repeats) for i, (images, repeats) in enumerate(draw(subsets_st)))
    class_images = draw(st.integers(0, 6))
    total = sum(i * r for _, i, r in subsets) + class_images
    n_buckets = draw(st.integers(1, min(4, total)))
    if n_buckets == 1:
        return DataCounts(subsets, class_images)
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=n_buckets - 1, max_size=n_buckets - 1,
                                unique=True)))
    sizes = tuple(b - a for a, b in zip([0, *cuts], [*cuts, total]))
    return DataCounts(subsets, class_images, sizes)


lengths = st.one_of(st.tuples(st.integers(1, 4), st.just(0)), st.tuples(st.just(1), st.integers(1, 60)))


@settings(max_examples=300, deadline=None)
@given(counts=datasets(), bs=st.integers(1, 4), ga=st.integers(1, 4), n=st.integers(1, 8), length=lengths,
       policy=st.sampled_from(["same_samples", "same_steps"]), keep=st.booleans())
def test_policy_invariants(counts, bs, ga, n, length, policy, keep):
    epochs, max_steps = length
    p = plan(counts, n, epochs=epochs, max_steps=max_steps, batch_size=bs, grad_accum=ga, policy=policy,
             keep_steps_per_epoch=keep)
    s, m = p.single, p.multi
    assert m.effective_batch == bs * ga * n and s.effective_batch == bs * ga
    divided = p.multi_counts.samples_per_epoch < counts.samples_per_epoch
    assert not divided or (keep and policy == "same_samples")
    if policy == "same_steps":
        assert m.total_steps == s.total_steps
    elif divided and not max_steps:
        # epochs chosen so the dataset samples trained are within half an (N-process) epoch of 1 GPU's
        assert abs(m.epochs * m.samples_per_epoch - s.total_samples_seen) <= m.samples_per_epoch / 2
    elif max_steps:
        # the optimizer steps' sample budget is within one (N-process) effective batch of 1 GPU's
        assert 0 <= m.total_steps * m.effective_batch - s.total_steps * s.effective_batch < m.effective_batch
    else:
        assert m.epochs == s.epochs
        # every sample trained as often as on 1 GPU; the only extra is the stated padding
        assert m.total_samples_seen - m.epochs * m.padding_per_epoch == s.total_samples_seen
    assert (m.padding_per_epoch > 0) == any("padded" in w for w in p.warnings)
    assert (p.adjustment == "") == (n == 1)


def run_like_the_trainer(p, buckets, batch_size, grad_accum, seed=0):
    """Drive N real samplers the way loop.py does; return what actually ran."""
    n, total = p.num_processes, p.multi.total_steps
    samplers = [BucketBatchSampler(buckets, batch_size, n, r, seed) for r in range(n)]
    steps = samples = epochs_run = 0
    for epoch in range(p.multi.epochs):
        per_rank = [s.batches(epoch) for s in samplers]
        assert len({len(b) for b in per_rank}) == 1
        assert len(per_rank[0]) == p.multi.batches_per_process_per_epoch == len(samplers[0])
        seen = Counter(i for batches in per_rank for batch in batches for i in batch)
        assert set(seen) == set(range(len(buckets)))
        assert sum(seen.values()) - len(buckets) == p.multi.padding_per_epoch
        epochs_run += 1
        steps_before = steps
        for start in range(0, len(per_rank[0]), grad_accum):
            samples += sum(len(b) for batches in per_rank for b in batches[start:start + grad_accum])
            steps += 1
            if steps >= total:
                break
        assert steps - steps_before == p.steps_in_epoch(epoch)
        if steps >= total:
            break
    return steps, epochs_run, samples


@settings(max_examples=120, deadline=None)
@given(counts=datasets(), bs=st.integers(1, 3), ga=st.integers(1, 3), n=st.integers(1, 5), length=lengths,
       policy=st.sampled_from(["same_samples", "same_steps"]), keep=st.booleans(), seed=st.integers(0, 3))
def test_plan_matches_the_real_sampler(counts, bs, ga, n, length, policy, keep, seed):
    epochs, max_steps = length
    p = plan(counts, n, epochs=epochs, max_steps=max_steps, batch_size=bs, grad_accum=ga, policy=policy,
             keep_steps_per_epoch=keep)
    sizes = p.multi_counts.buckets()       # the epoch the N-process run trains
    buckets = [b for b, size in enumerate(sizes) for _ in range(size)]
    assert BucketBatchSampler(buckets, bs).bucket_sizes == sizes
    steps, epochs_run, samples = run_like_the_trainer(p, buckets, bs, ga, seed)
    assert steps == p.multi.total_steps
    assert epochs_run == p.multi.epochs
    cut = p.multi.total_steps % p.multi.steps_per_epoch
    g = bs * n
    short_deficit = sum(g - n * math.ceil(size % g / n) for size in sizes if size % g)
    if cut == 0 or not short_deficit:
        assert samples == p.multi.total_samples_seen
    else:  # a cut last epoch is counted at full batches: short ones landing there train less
        assert p.multi.total_samples_seen - short_deficit <= samples <= p.multi.total_samples_seen
