"""Data-dependent ops on the meta device, answered as if every mask were all true.

The memory probes (memory_probe.py) run full-size models on the meta device, where tensors have shapes
but no values. Some families' forwards ask a value: transformers' causal-mask helpers check whether an
attention mask is all ones (`.item()`), Z-Image keeps a caption's valid tokens by a boolean mask
(`hidden[mask]`, `nonzero`), Qwen-Image counts them (`mask.sum().max()`). A GPU answers from the
data; here `AllValid` answers as for a mask of ones: every token of the padded text length is a real
token. That is the longest caption the text length allows, so the measured memory is the most a step
of that text length can take (the planner's side of the bargain: never under-estimate).
"""
from __future__ import annotations

import math
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _is_meta(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


class AllValid(TorchDispatchMode):
    """Answers the data-dependent ops on meta tensors (others run unchanged); `asked` counts the answers
    by op, so a probe can say what it assumed."""

    def __init__(self, full_count: int = sys.maxsize):
        super().__init__()
        # what an integer scalar reads as: a count of valid tokens, which code uses to cut a padded
        # sequence (`hidden[:, :count]`): "more than there are" keeps the whole padded length
        self.full_count = full_count
        self.asked: dict[str, int] = {}

    def _note(self, func) -> None:
        name = str(func.overloadpacket.__name__)
        self.asked[name] = self.asked.get(name, 0) + 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet is aten._local_scalar_dense and _is_meta(args[0]):
            self._note(func)
            t = args[0]
            if t.dtype == torch.bool:
                return True
            if t.is_floating_point():
                return 1.0
            return self.full_count
        if packet in (aten.nonzero, aten.argwhere) and _is_meta(args[0]):
            self._note(func)
            t = args[0]
            return torch.empty((t.numel(), t.dim()), dtype=torch.long, device="meta")
        if packet is aten.masked_select and _is_meta(args[0]):
            self._note(func)
            shape = torch.broadcast_shapes(args[0].shape, args[1].shape)
            return torch.empty(math.prod(shape), dtype=args[0].dtype, device="meta")
        if packet is aten.index and _is_meta(args[0]) and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            self._note(func)
            return func(args[0], self._long_indices(args[1]))
        return func(*args, **kwargs)

    @staticmethod
    def _long_indices(indices) -> list:
        """A boolean index of shape S selects, when all true, prod(S) positions: one long index per dim."""
        out = []
        for i in indices:
            if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
                n = i.numel()
                out += [torch.empty(n, dtype=torch.long, device="meta") for _ in range(i.dim())]
            else:
                out.append(i)
        return out
