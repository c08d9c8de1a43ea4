"""A weight's storage moved between host and device memory while the Parameter object stays the same
(training/block_swap.py), for plain tensors and for the quantized weights compute/quantize.py makes:

- torchao's int8/float8 weight-only tensors are wrapper subclasses: the Parameter *is* the wrapper, and
  its values live in inner tensors (qdata, scale, ...) held as Python attributes. `param.data = copy`
  changes only the wrapper's metadata (device, dtype, shape), never those inner tensors, so a copy is
  installed by setting both (`install`); copies are made leaf by leaf through the wrappers' own
  `__tensor_flatten__`/`__tensor_unflatten__` (`copy_storage`), so each inner tensor can be pinned and
  copied without blocking like any plain tensor.
- bitsandbytes' Params4bit (nf4) is a plain uint8 tensor plus a `quant_state` (absmax, code, the nested
  state's absmax and code) held by the Parameter: the state travels with it (`copy_quant_state`).
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

Leaf = Callable[[torch.Tensor], torch.Tensor]


def is_wrapper(t: torch.Tensor) -> bool:
    """A tensor subclass whose values live in inner tensors (torchao's quantized weights)."""
    return is_traceable_wrapper_subclass(t)


def inner_names(t: torch.Tensor) -> list[str]:
    return list(t.__tensor_flatten__()[0]) if is_wrapper(t) else []


def copy_storage(data: torch.Tensor, fn: Leaf) -> torch.Tensor:
    """`data` rebuilt with `fn` applied to each plain tensor inside it (itself when it is plain)."""
    if not is_wrapper(data):
        return fn(data)
    names, context = data.__tensor_flatten__()
    inner = {name: copy_storage(getattr(data, name), fn) for name in names}
    return type(data).__tensor_unflatten__(inner, context, data.size(), data.stride())


def leaves(data: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `data`'s values."""
    if not is_wrapper(data):
        return [data]
    return [leaf for name in inner_names(data) for leaf in leaves(getattr(data, name))]


def storage_of(param: torch.Tensor) -> torch.Tensor:
    """Its values as `install` takes them back: `.data` for a plain weight; for a quantized one a new
    wrapper holding its current inner tensors (installing another copy later leaves this one as it is)."""
    return copy_storage(param, lambda t: t) if is_wrapper(param) else param.data


def install(param: torch.Tensor, storage: torch.Tensor) -> None:
    """Make `param` (the same object: optimizers, hooks and autograd's saved references hold it) read
    its values from `storage` (a `copy_storage` of its own storage)."""
    if is_wrapper(param):
        param.data = storage   # the wrapper's metadata (device)
        for name in inner_names(storage):
            setattr(param, name, getattr(storage, name))
    else:
        param.data = storage


def quant_state_of(param: torch.Tensor):
    """bitsandbytes' QuantState of a Params4bit weight (None for every other tensor)."""
    return getattr(param, "quant_state", None) if isinstance(param, torch.nn.Parameter) else None


def copy_quant_state(state, fn: Leaf):
    """A QuantState (and its nested state) with `fn` applied to its tensors; `state` is left as it is."""
    out = copy.copy(state)
    for name, value in vars(state).items():
        if isinstance(value, torch.Tensor):
            setattr(out, name, fn(value))
        elif type(value) is type(state):
            setattr(out, name, copy_quant_state(value, fn))
    return out


def quant_state_leaves(state) -> list[torch.Tensor]:
    if state is None:
        return []
    out = []
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif type(value) is type(state):
            out += quant_state_leaves(value)
    return out
