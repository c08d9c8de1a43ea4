"""The memory planner's meta-device probe of Qwen-Image 2.1's transformer (training/memory_probe.py).

The transformer computes its joint text/image layout from the VALUES of img_mask (which slots hold
image tokens, where each image block starts): values a meta tensor does not have. The family hands the
probe's forward a real (CPU) img_mask built from the known layout (captions, then the target's slots),
and this mode lets the layout's small CPU tensors meet the model's meta tensors: a boolean index
becomes the long indices its real values select, anything else is moved to the meta device. The
activations measured are the real blocks' on the real sequence length."""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map


def _cpu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def _meta(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


class LayoutOnMeta(TorchFunctionMode):
    """Above autograd (a function mode), so what autograd saves for the backward pass is already on
    the meta device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves, _ = tree_flatten((args, kwargs))
        if any(map(_meta, leaves)) and any(map(_cpu, leaves)):
            if func in (torch.Tensor.repeat_interleave, torch.repeat_interleave) and _cpu(args[1]):
                kwargs = {**kwargs, "output_size": int(args[1].sum())}  # what a meta tensor cannot count
            if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
                args = (args[0], _index(args[1]), *(_to_meta(a) for a in args[2:]))
            else:
                args, kwargs = _to_meta(args), _to_meta(kwargs)
        return func(*args, **kwargs)


def _to_meta(value):
    return tree_map(lambda t: t.to("meta") if _cpu(t) else t, value)


def _index(index):
    """An index with boolean CPU masks -> the long indices their values select, on the meta device."""
    parts = index if isinstance(index, tuple) else (index,)
    out = []
    for part in parts:
        if _cpu(part) and part.dtype == torch.bool:
            out += [i.to("meta") for i in part.nonzero(as_tuple=True)]
        else:
            out.append(_to_meta(part))
    return tuple(out)


@contextmanager
def layout_on_meta(denoiser):
    """LayoutOnMeta for one forward call, and the blocks' gradient-checkpointing calls handed meta copies
    of the layout's CPU tensors, so the recomputation in the backward pass (outside this mode) has them."""
    checkpointing = getattr(denoiser, "_gradient_checkpointing_func", None)
    if checkpointing is not None:
        denoiser._gradient_checkpointing_func = lambda block, *args: checkpointing(block, *_to_meta(args))
    try:
        with LayoutOnMeta():
            yield
    finally:
        if checkpointing is not None:
            denoiser._gradient_checkpointing_func = checkpointing
