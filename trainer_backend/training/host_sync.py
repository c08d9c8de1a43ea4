"""A step that does not wait on the host (docs/performance.md).

On a GPU every `.item()`, `float(t)`, `bool(t)`, `.tolist()` or data-dependent shape (`nonzero`, boolean
indexing) of a device tensor makes the host wait until the device has finished everything queued before it;
a step whose kernels are small (LoRA, batch 1) then runs at the speed the host queues them. So the loop keeps
each step's loss on the device (`StepLosses`) and reads the pending ones in one transfer every
`speed.host_read_every` steps, checking them for NaN/inf then; a checkpoint reads them first, so no checkpoint
is saved after a non-finite loss.

`HostReads` counts such reads per optimizer step (speed.count_host_reads): a TorchFunctionMode that sees
every tensor method call, so it counts on the CPU as well, where the same calls would be syncs on a GPU.
"""
from __future__ import annotations

import logging
import traceback
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

LOG = logging.getLogger("trainer")
READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "nonzero", "numpy", "argwhere",
         "masked_select", "unique"}  # the host needs the value (or a data-dependent shape)


def read_interval(cfg, device) -> int:
    """speed.host_read_every; 0 = 1 on the CPU (a read costs nothing there) and 10 on an accelerator."""
    every = cfg.speed.host_read_every
    return every if every > 0 else (1 if torch.device(device).type == "cpu" else 10)


class StepLosses:
    """Step losses kept on the device until they are read, all pending ones in one transfer."""

    def __init__(self, every: int):
        self.every = every
        self.pending: list[tuple[int, torch.Tensor]] = []

    def add(self, step: int, loss: torch.Tensor) -> None:
        self.pending.append((step, loss.detach().reshape(())))

    def due(self, step: int, total: int) -> bool:
        return step % self.every == 0 or step >= total

    def read(self) -> list[tuple[int, float]]:
        """[(step, loss)] of the pending steps, oldest first (one host read)."""
        if not self.pending:
            return []
        values = torch.stack([loss for _, loss in self.pending]).float().cpu().tolist()
        out = [(step, value) for (step, _), value in zip(self.pending, values)]
        self.pending = []
        return out


class HostReads(TorchFunctionMode):
    """Counts host reads of tensor values while active; `where` keeps the first few call sites."""

    def __init__(self, host: dict[int, torch.Tensor] | None = None, on_cpu: bool = True):
        super().__init__()
        self.count, self.where, self.on_cpu = 0, Counter(), on_cpu
        self.host = dict(host or {})  # id -> tensor (kept alive so ids stay unique): host data and what is
        # computed from it alone, which stays on the host on a GPU too

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        reads = name in READS or (name == "__getitem__" and _bool_index(args)) or (
            name == "repeat_interleave" and len(args) > 1 and isinstance(args[1], torch.Tensor))
        if reads and _device_read(args[1:] if name == "__getitem__" else args, self.host, self.on_cpu):
            self.count += 1
            if len(self.where) < 8:
                self.where[f"{name} at {_caller()}"] += 1
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in _tensors((args, kwargs or {}))]
        if name == "to":  # onto the device: what comes out is device data, even where the device is the CPU
            if inputs and out is inputs[0] and id(out) in self.host:  # the device and `.to` returned the same
                out = out.view_as(out)
        elif inputs and all(id(t) in self.host for t in inputs):
            self.host.update((id(t), t) for t in _tensors(out))
        return out


def _device_read(args, host: dict, on_cpu: bool) -> bool:
    """A read the device would wait for. On an accelerator: of a tensor on it. On the CPU (no device to wait
    for) every read counts except those of data that stays on the host on a GPU too: the batch as the loader
    made it (`host`) and torch.optim's step counters (non-capturable optimizers). So the CPU count is
    the GPU count."""
    first = args[0] if args else None
    tensor = first if isinstance(first, torch.Tensor) else next(_tensors(first), None)
    if tensor is not None and tensor.device.type != "cpu":
        return True
    if tensor is not None and (not on_cpu or id(tensor) in host):  # indexing: `args` is the index
        return False  # a host tensor: no wait
    return not any("/torch/optim/" in f.filename for f in traceback.extract_stack(limit=12))


def _caller() -> str:
    """The innermost frame outside torch and this file: where the read was asked for."""
    for frame in reversed(traceback.extract_stack(limit=16)):
        if "/torch/" not in frame.filename and not frame.filename.endswith("host_sync.py"):
            return f"{'/'.join(frame.filename.rsplit('/', 2)[-2:])}:{frame.lineno}"
    return "?"


def _bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class StepReadCounter:
    """speed.count_host_reads: a HostReads around each optimizer step; `take()` the count since the last take."""

    def __init__(self, enabled: bool, device="cpu"):
        self.enabled, self.total, self.places = enabled, 0, Counter()
        self.on_cpu = torch.device(device).type == "cpu"  # elsewhere only reads of device tensors count

    def step(self, group: list[dict]):
        """Around one optimizer step over `group`, the batches as the loader made them (host data)."""
        import contextlib
        if not self.enabled:
            return contextlib.nullcontext()
        return _Counting(self, {id(t): t for batch in group for t in _tensors(batch)})

    def take(self) -> dict:
        if not self.enabled:
            return {}
        out = {"host_reads": self.total}
        if self.total:
            LOG.info("host reads in the last steps: %s", dict(self.places))
        self.total, self.places = 0, Counter()
        return out


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


class _Counting:
    def __init__(self, counter: StepReadCounter, host: dict[int, torch.Tensor]):
        self.counter, self.mode = counter, HostReads(host, counter.on_cpu)

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        self.counter.total += self.mode.count
        self.counter.places.update(self.mode.where)
        return False
