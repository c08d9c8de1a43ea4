"""The step plan: the only place step arithmetic lives (pure, no torch).

The GUI, the CLI `plan` command and the trainer all call `make_plan`, so what the GUI shows is
what runs. It counts exactly what data/sampler.py yields:
- an epoch is every sample once: Σ images × repeats + class samples, grouped in buckets;
- each bucket is cut into global batches of batch_size × N; a bucket's last one may be short;
  a short global batch of L samples gives every process ceil(L/N) samples (padding repeats
  samples of that batch, so all ranks run the same number of passes);
- batches per process per epoch = Σ_b ceil(n_b / (batch_size·N)); optimizer steps per epoch
  = ceil(batches / grad_accum) (the last, partial accumulation group of an epoch still steps);
- a length in steps cuts the last epoch short at total_steps.

Multi-GPU policies (N processes):
- same_samples (default): N processes train as many samples as 1 would. A length in steps is
  divided by N (rounded up); a length in epochs keeps the epochs (each epoch is shared by the
  N processes). keep_steps_per_epoch instead divides every subset's repeats by N (rounded to the
  nearest, at least 1) and multiplies the epochs to keep the samples: N× as many, N× shorter
  epochs, which is what the multi-GPU article in shared/reference did by hand.
- same_steps: the optimizer steps of the 1-process plan, each training N× the samples.
LR scaling (none|linear|sqrt) follows the effective batch relative to the 1-process plan.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # config imports pydantic; the plan itself needs nothing but numbers
    from ..config import TrainConfig

POLICIES = ("same_samples", "same_steps")
LR_SCALINGS = ("none", "linear", "sqrt")


@dataclass(frozen=True)
class DataCounts:
    """What an epoch holds. bucket_sizes: samples per bucket per epoch (class samples included,
    in whatever buckets their shapes put them); None means one bucket for everything."""
    subsets: tuple[tuple[str, int, int], ...]   # (name, images, repeats)
    class_images: int = 0                        # class (prior-preservation) samples per epoch
    bucket_sizes: tuple[int, ...] | None = None

    @property
    def samples_per_epoch(self) -> int:
        return sum(images * repeats for _, images, repeats in self.subsets) + self.class_images

    def buckets(self) -> tuple[int, ...]:
        if self.bucket_sizes is None:
            return (self.samples_per_epoch,)
        return tuple(b for b in self.bucket_sizes if b > 0)

    def check(self) -> None:
        for name, images, repeats in self.subsets:
            if images < 0 or repeats < 1:
                raise ValueError(f"subset {name!r}: images must be ≥ 0 and repeats ≥ 1, got {images}, {repeats}")
        if self.class_images < 0:
            raise ValueError(f"class_images must be ≥ 0, got {self.class_images}")
        if self.samples_per_epoch < 1:
            raise ValueError("the dataset has no training samples")
        if self.bucket_sizes is not None and (min(self.bucket_sizes, default=0) < 0
                                              or sum(self.bucket_sizes) != self.samples_per_epoch):
            raise ValueError(f"bucket_sizes sum to {sum(self.bucket_sizes)}, but an epoch has "
                             f"{self.samples_per_epoch} samples (images × repeats + class images)")


def _label(text: str) -> Any:
    return field(metadata={"label": text})


@dataclass(frozen=True)
class PlanColumn:
    """One side of the plan: the run on `num_processes` processes."""
    num_processes: int = _label("processes")
    samples_per_epoch: int = _label("samples per epoch")
    padding_per_epoch: int = _label("padding per epoch (repeated samples)")
    batches_per_process_per_epoch: int = _label("batches per process per epoch")
    steps_per_epoch: int = _label("optimizer steps per epoch")
    epochs: int = _label("epochs")
    total_steps: int = _label("total optimizer steps")
    total_samples_seen: int = _label("total samples seen")
    effective_batch: int = _label("effective batch")
    lr: float = _label("learning rate")
    warmup_steps: int = _label("warmup steps")

    @property
    def samples_per_process_per_epoch(self) -> int:
        return (self.samples_per_epoch + self.padding_per_epoch) // self.num_processes


@dataclass
class Plan:
    num_processes: int
    policy: str
    length_unit: str                 # "epochs" or "steps" (schedule.max_steps > 0)
    single: PlanColumn
    multi: PlanColumn
    adjustment: str                  # one sentence; "" when N = 1
    warnings: list[str]
    counts: DataCounts
    multi_counts: DataCounts         # the epoch the N-process run trains (repeats may be divided)
    lr_scaling: str = "none"

    def steps_in_epoch(self, epoch: int) -> int:
        """Optimizer steps the N-process run makes in `epoch` (0-based): the last one may be cut."""
        m = self.multi
        return max(0, min(m.steps_per_epoch, m.total_steps - epoch * m.steps_per_epoch))

    @property
    def lr_factor(self) -> float:
        """What hardware.lr_scaling multiplies every learning rate (param group) by on N processes."""
        ratio = self.multi.effective_batch / self.single.effective_batch
        return _scaled_lr(1.0, ratio, self.lr_scaling)

    def multi_repeats(self) -> dict[str, int]:
        """Repeats per subset for the N-process run (differs only with keep_steps_per_epoch)."""
        return {name: repeats for name, _, repeats in self.multi_counts.subsets}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; this is the `plan` event."""
        subsets = [{"name": name, "images": images, "repeats": repeats, "repeats_multi": multi}
                   for (name, images, repeats), (_, _, multi) in zip(self.counts.subsets, self.multi_counts.subsets)]
        return {"num_processes": self.num_processes, "policy": self.policy, "length_unit": self.length_unit,
                "lr_scaling": self.lr_scaling, "single": asdict(self.single), "multi": asdict(self.multi),
                "adjustment": self.adjustment, "warnings": list(self.warnings), "subsets": subsets,
                "class_images": self.counts.class_images, "class_images_multi": self.multi_counts.class_images}


# ----------------------------------------------------------------------------- arithmetic

def _column(buckets: tuple[int, ...], n: int, batch_size: int, grad_accum: int, *,
            epochs: int | None = None, total_steps: int | None = None) -> PlanColumn:
    """Counts for one run; exactly one of epochs / total_steps gives the length."""
    global_batch = batch_size * n
    batches = per_process_samples = 0
    for size in buckets:
        full, short = divmod(size, global_batch)
        batches += full + (short > 0)
        per_process_samples += full * batch_size + math.ceil(short / n)
    samples = sum(buckets)
    steps_per_epoch = math.ceil(batches / grad_accum)
    if total_steps is None:
        total_steps = epochs * steps_per_epoch
    else:
        epochs = math.ceil(total_steps / steps_per_epoch)
    full_epochs, cut_steps = divmod(total_steps, steps_per_epoch)
    # A cut last epoch is counted at full batches: short batches landing there make it slightly less.
    cut_samples = min(cut_steps * grad_accum * batch_size, per_process_samples)
    seen = (full_epochs * per_process_samples + cut_samples) * n
    return PlanColumn(num_processes=n, samples_per_epoch=samples, padding_per_epoch=per_process_samples * n - samples,
                      batches_per_process_per_epoch=batches, steps_per_epoch=steps_per_epoch, epochs=epochs,
                      total_steps=total_steps, total_samples_seen=seen, effective_batch=global_batch * grad_accum,
                      lr=0.0, warmup_steps=0)


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def divide_repeats(counts: DataCounts, n: int) -> tuple[DataCounts, list[str]]:
    """Repeats (and class samples) divided by n, rounded to the nearest and at least 1; notes
    state every rounding. Bucket sizes are scaled in proportion (largest remainder)."""
    notes, subsets = [], []
    for name, images, repeats in counts.subsets:
        divided = max(1, _round_half_up(repeats / n))
        if divided * n != repeats:
            notes.append(f"subset '{name}': repeats {repeats} ÷ {n} = {repeats / n:g}, rounded to {divided}")
        subsets.append((name, images, divided))
    class_images = max(1, _round_half_up(counts.class_images / n)) if counts.class_images else 0
    if class_images * n != counts.class_images and counts.class_images:
        notes.append(f"class samples {counts.class_images} ÷ {n} rounded to {class_images}")
    out = DataCounts(tuple(subsets), class_images, None)
    if counts.bucket_sizes is not None:
        target, total = out.samples_per_epoch, counts.samples_per_epoch
        exact = [b * target / total for b in counts.bucket_sizes]
        sizes = [math.floor(x) for x in exact]
        by_remainder = sorted(range(len(exact)), key=lambda i: sizes[i] - exact[i])
        for i in by_remainder[:target - sum(sizes)]:
            sizes[i] += 1
        out = replace(out, bucket_sizes=tuple(sizes))
        notes.append("bucket sizes scaled in proportion to the divided repeats")
    return out, notes


def _scaled_lr(lr: float, factor: float, scaling: str) -> float:
    return {"none": lr, "linear": lr * factor, "sqrt": lr * math.sqrt(factor)}[scaling]


# ----------------------------------------------------------------------------- the plan

def make_plan(counts: DataCounts, *, batch_size: int, grad_accum: int, epochs: int, max_steps: int,
              num_processes: int, policy: str = "same_samples", keep_steps_per_epoch: bool = False,
              lr: float = 0.0, lr_scaling: str = "none", warmup_steps: int = 0,
              multi_counts: DataCounts | None = None) -> Plan:
    """The 1-process plan and the N-process plan side by side. A length in steps (max_steps > 0)
    wins over epochs. `multi_counts` (keep_steps_per_epoch only) gives the exact counts of the
    dataset rebuilt with divided repeats, instead of the proportional estimate."""
    for name, value in (("batch_size", batch_size), ("grad_accum", grad_accum), ("num_processes", num_processes)):
        if value < 1:
            raise ValueError(f"{name} must be ≥ 1, got {value}")
    if max_steps < 0 or (max_steps == 0 and epochs < 1):
        raise ValueError(f"need epochs ≥ 1 or max_steps ≥ 1, got epochs={epochs}, max_steps={max_steps}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f"lr_scaling must be one of {LR_SCALINGS}, got {lr_scaling!r}")
    counts.check()
    n, by_steps = num_processes, max_steps > 0
    length = {"total_steps": max_steps} if by_steps else {"epochs": epochs}
    single = _column(counts.buckets(), 1, batch_size, grad_accum, **length)
    single = replace(single, lr=lr, warmup_steps=warmup_steps)
    plan = Plan(n, policy, "steps" if by_steps else "epochs", single, single, "", [], counts, counts, lr_scaling)
    if n == 1:
        return plan

    run_counts, warnings = counts, []
    if policy == "same_steps":
        if keep_steps_per_epoch:
            warnings.append("keep_steps_per_epoch applies to the same_samples policy only; ignored")
        multi = _column(counts.buckets(), n, batch_size, grad_accum, total_steps=single.total_steps)
        warmup = warmup_steps
    else:
        if keep_steps_per_epoch:
            run_counts, notes = divide_repeats(counts, n)
            if multi_counts is not None:
                multi_counts.check()
                run_counts, notes = multi_counts, [note for note in notes if not note.startswith("bucket")]
            warnings += notes
            if run_counts.samples_per_epoch >= counts.samples_per_epoch:
                warnings.append(f"keep_steps_per_epoch: repeats cannot be divided by {n}; epochs kept instead")
                run_counts = counts
        if by_steps:
            multi = _column(run_counts.buckets(), n, batch_size, grad_accum, total_steps=math.ceil(max_steps / n))
        else:
            ratio = counts.samples_per_epoch / run_counts.samples_per_epoch
            multi = _column(run_counts.buckets(), n, batch_size, grad_accum,
                            epochs=max(1, _round_half_up(epochs * ratio)))
        # Warmup keeps its share of the run (a 1-GPU preset's warmup in steps shrinks with the run).
        warmup = min(multi.total_steps, math.ceil(warmup_steps * multi.total_steps / single.total_steps))
    factor = multi.effective_batch / single.effective_batch
    multi = replace(multi, lr=_scaled_lr(lr, factor, lr_scaling), warmup_steps=warmup)
    warnings += _rounding_notes(single, multi, batch_size)
    plan.multi, plan.multi_counts, plan.warnings = multi, run_counts, warnings
    plan.adjustment = _adjustment(plan, keep_steps_per_epoch and run_counts is not counts, max_steps, epochs)
    return plan


def _rounding_notes(single: PlanColumn, multi: PlanColumn, batch_size: int) -> list[str]:
    notes = []
    n = multi.num_processes
    if multi.padding_per_epoch:
        notes.append(f"short batches are padded so all {n} processes get the same number of samples: "
                     f"{multi.padding_per_epoch} sample(s) of the same batch repeated per epoch "
                     f"({multi.samples_per_epoch} → {multi.samples_per_epoch + multi.padding_per_epoch})")
    if batch_size * n > multi.samples_per_epoch:
        notes.append(f"the global batch ({batch_size} × {n} = {batch_size * n}) is larger than an epoch "
                     f"({multi.samples_per_epoch} samples): lower the batch size or the number of processes")
    return notes


def _lr_clause(plan: Plan) -> str:
    if plan.lr_scaling == "none" or plan.single.lr == plan.multi.lr:
        return ""
    factor = plan.multi.effective_batch / plan.single.effective_batch
    how = f"×{factor:g}" if plan.lr_scaling == "linear" else f"×√{factor:g}"
    return (f"; learning rate scaled {plan.lr_scaling} with the effective batch "
            f"({how}: {plan.single.lr:g} → {plan.multi.lr:g})")


def _adjustment(plan: Plan, divided: bool, max_steps: int, epochs: int) -> str:
    s, m, n = plan.single, plan.multi, plan.num_processes
    batch = f"effective batch {s.effective_batch} → {m.effective_batch}"
    if plan.policy == "same_steps":
        text = (f"Same {m.total_steps} optimizer steps as on 1 GPU, but each trains {n}× the samples ({batch}): "
                f"{m.total_samples_seen} samples instead of {s.total_samples_seen}, over {m.epochs} epochs "
                f"instead of {s.epochs}")
    elif divided:
        first = plan.counts.subsets[0] if plan.counts.subsets else None
        example = (f" ({first[2]} → {plan.multi_counts.subsets[0][2]} for '{first[0]}')" if first else "")
        text = (f"Repeats divided by {n}{example}, so each epoch holds 1/{n} of the data in "
                f"{m.steps_per_epoch} optimizer steps; {m.epochs} epochs instead of {s.epochs} train about the "
                f"same samples as 1 GPU ({m.total_samples_seen} vs {s.total_samples_seen}) in "
                f"{m.total_steps} steps instead of {s.total_steps}")
    elif plan.length_unit == "steps":
        text = (f"Each optimizer step on {n} GPUs trains {n}× the samples ({batch}), so max_steps {max_steps} "
                f"became {m.total_steps} ({max_steps} ÷ {n}, rounded up) to train as many samples as 1 GPU "
                f"({m.total_samples_seen} vs {s.total_samples_seen}) over {m.epochs} epochs instead of {s.epochs}")
    else:
        text = (f"Epochs stay {epochs}: each epoch is shared by {n} GPUs, so it takes {m.steps_per_epoch} "
                f"optimizer steps instead of {s.steps_per_epoch} and the run {m.total_steps} instead of "
                f"{s.total_steps}, training the same samples ({batch})")
    return text + _lr_clause(plan) + "."


def plan_from_config(cfg: "TrainConfig", counts: DataCounts, num_processes: int | None = None) -> Plan:
    """The plan for a config; num_processes defaults to hardware.num_processes × num_machines."""
    hw, sched = cfg.hardware, cfg.schedule
    n = num_processes or hw.num_processes * getattr(hw, "num_machines", 1)
    plan = make_plan(counts, batch_size=sched.batch_size, grad_accum=sched.grad_accum, epochs=sched.epochs,
                     max_steps=sched.max_steps, num_processes=n, policy=hw.multi_gpu_policy,
                     keep_steps_per_epoch=getattr(hw, "keep_steps_per_epoch", False), lr=cfg.optimizer.lr,
                     lr_scaling=getattr(hw, "lr_scaling", "none"), warmup_steps=cfg.optimizer.warmup_steps)
    from ..training.full_half_precision import half_weights_warnings  # pure, like this module
    plan.warnings = list(plan.warnings) + half_weights_warnings(cfg) + [
        line for line in [training_adapter_line(cfg)] if line]
    return plan


def training_adapter_line(cfg: "TrainConfig") -> str:
    """network.training_adapter in the run log and the plan ("" when off); methods/training_adapter.py applies it."""
    n = cfg.network
    if not n.training_adapter or n.type != "lora":
        return ""
    weight = f" at weight {n.training_adapter_weight:g}" if n.training_adapter_weight != 1 else ""
    return f"training adapter: {n.training_adapter}{weight} (applied to training steps, off for samples)"


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_plan_table(plan: Plan) -> str:
    """The CLI `plan` output: 1 GPU and N side by side, then the adjustment and warnings."""
    n = plan.num_processes
    heads = ("1 GPU", f"{n} GPUs" if n > 1 else "this run")
    rows = [(f.metadata["label"], _fmt(getattr(plan.single, f.name)), _fmt(getattr(plan.multi, f.name)))
            for f in fields(PlanColumn) if f.name != "num_processes"]
    width = max(len(label) for label, _, _ in rows)
    cols = [max(len(heads[i]), *(len(r[i + 1]) for r in rows)) for i in range(2)]
    lines = [f"Step plan ({plan.policy}, length in {plan.length_unit})",
             f"  {'':<{width}}  {heads[0]:>{cols[0]}}  {heads[1]:>{cols[1]}}"]
    lines += [f"  {label:<{width}}  {a:>{cols[0]}}  {b:>{cols[1]}}" for label, a, b in rows]
    if plan.adjustment:
        lines.append(plan.adjustment)
    lines += [f"note: {w}" for w in plan.warnings]
    return "\n".join(lines)
