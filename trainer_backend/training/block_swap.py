"""Block swap (memory.block_swap) and offloaded encoders (memory.offload_encoders): modules whose weights
live in host (CPU) memory and visit the accelerator only while they run.

`BlockSwap(blocks, count, device)` takes a model's blocks in forward order (the family's `blocks(model)`)
and keeps the last `count` of them on the host. Each weight keeps its Parameter object (optimizers,
EMA, checkpoints and autograd's saved references all hold that object); only its `.data` changes:
a pinned host copy between uses, a fresh accelerator copy while it runs. Quantized weights of a frozen
base (model.quantize: torchao's int8/float8 tensors, bitsandbytes' nf4 with its quant_state) move the
same way, inner tensors and quantization state included (compute/weight_storage.py), at their quantized
size; peft's adapters on them are plain weights of the same block. Hooks drive the moves:

- forward: a block's forward pre-hook waits for it (fetching it if no prefetch did) and starts copying
  the next swapped block on a side stream; its forward hook sends it back (frozen weights are simply
  dropped: the host copy is still exact) and, when gradients flow, hooks the block's output tensors;
- backward: when autograd reaches a hook on a block's output, every node created after that block in
  the forward pass has already run (the engine runs the latest-created ready node first, and on one
  device one thread runs them all), so every later block is finished: those go back to the host (with
  their trained values, gradients and optimizer state, where present) and the previous swapped block is
  prefetched. A callback queued on the autograd engine sends the rest home when the backward ends and
  waits for the copies, so code on the CPU (an optimizer step, EMA, a checkpoint) sees final values.
- a forward rerun inside the backward (gradient checkpointing) only makes sure the block is there.

The same class with `prefetch=False, move_inputs=True` and every unit swapped offloads frozen text
encoders and the VAE (`offload_frozen`): each top-level part comes to the accelerator for its own call.

On a CPU-only machine host and device are the same device, but the copies are still real (a fetched
weight is a new tensor, the host copy is restored afterwards) and `moves` records each move, so the
mechanism is tested on the CPU; on CUDA only the stream and pinning lines differ.
"""
from __future__ import annotations

import logging
from collections import deque

import torch

from ..compute.devices import compute_stream, on_stream, side_stream
from ..compute.weight_storage import copy_quant_state, copy_storage, install, quant_state_of, storage_of

LOG = logging.getLogger("trainer")
HOST = torch.device("cpu")
MOVES_KEPT = 10_000  # the latest moves (tests, logs); a long run must not grow a list forever


def in_backward() -> bool:
    """True while autograd's engine runs (backward hooks, checkpointed forwards being recomputed)."""
    return torch._C._current_graph_task_id() != -1


def _tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):  # diffusers' output dataclasses are tuples/dicts too
        return [t for item in tree for t in _tensors(item)]
    return []


def _to_device(tree, device):
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, list):  # in place: a caller's list may be a cache its callees fill (AutoencoderKLWan's)
        tree[:] = [_to_device(t, device) for t in tree]
        return tree
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return type(tree)(_to_device(t, device) for t in tree)
    if isinstance(tree, dict):
        return {k: _to_device(v, device) for k, v in tree.items()}
    return tree


class BlockSwap:
    def __init__(self, blocks: list[torch.nn.Module], count: int, device, *, optimizer=None,
                 prefetch: bool = True, move_inputs: bool = False):
        """optimizer: its per-weight state travels with the weights in the backward pass (a fused
        backward steps there). move_inputs: move a unit's tensor arguments to the device (encoders,
        whose callers put inputs next to the first weight they see)."""
        if not 0 < count <= len(blocks):
            raise ValueError(f"count must be 1..{len(blocks)}, got {count}")
        self.blocks, self.device = list(blocks), torch.device(device)
        self.swapped = set(range(len(blocks) - count, len(blocks)))
        self.optimizer, self.prefetch, self.move_inputs = optimizer, prefetch, move_inputs
        self.stream = side_stream(self.device)   # None on a CPU: copies then simply run in order
        self.cuda = self.stream is not None
        self.tensors: dict[int, list[torch.Tensor]] = {}   # block -> its weights and buffers (each once)
        self.host: dict[int, torch.Tensor] = {}            # id(weight) -> its host copy (compute/weight_storage.py)
        self.host_states: dict[int, object] = {}           # id(weight) -> its nf4 quant_state's host copy
        self.resident: dict[int, dict] = {}                # block -> {"event": cuda event|None, "full": bool}
        self.moves: deque[tuple[str, int]] = deque(maxlen=MOVES_KEPT)  # ("fetch"|"offload", block), latest
        self.callback_queued = False
        self.handles = []
        seen: set[int] = set()
        for k in sorted(self.swapped):
            own = [t for t in (*blocks[k].parameters(), *blocks[k].buffers()) if id(t) not in seen]
            seen.update(id(t) for t in own)
            self.tensors[k] = own
            for t in own:
                self.host[id(t)] = copy_storage(storage_of(t), self._host_copy)
                install(t, self.host[id(t)])
                state = quant_state_of(t)
                if state is not None:  # nf4: its quantization state travels with it
                    self.host_states[id(t)] = copy_quant_state(state, self._host_copy)
                    t.quant_state = self.host_states[id(t)]
        for k, block in enumerate(self.blocks):
            self.handles.append(block.register_forward_pre_hook(self._make_pre(k), with_kwargs=True))
            self.handles.append(block.register_forward_hook(self._make_post(k)))

    # ------------------------------------------------------------------ moves
    def _compute(self):
        return compute_stream(self.device)

    def _side(self):
        return on_stream(self.stream)

    def _state(self, t: torch.Tensor) -> list[tuple[dict, str]]:
        """(holder, key) of the optimizer state that travels with weight t in the backward pass."""
        state = self.optimizer.state.get(t) if self.optimizer is not None else None
        return [(state, key) for key, v in (state or {}).items() if isinstance(v, torch.Tensor) and v.dim() > 0]

    def _fetch(self, k: int, full: bool) -> None:
        """Start copying block k to the device (and, when `full`, its gradients and optimizer state)."""
        entry = self.resident.get(k)
        if entry is not None and (entry["full"] or not full):
            return
        compute = self._compute()
        with self._side():
            for t in self.tensors[k]:
                if entry is None:
                    install(t, copy_storage(self.host[id(t)], lambda x: self._to_device(x, compute)))
                    if id(t) in self.host_states:
                        t.quant_state = copy_quant_state(self.host_states[id(t)],
                                                         lambda x: self._to_device(x, compute))
                if full and isinstance(t, torch.nn.Parameter):
                    if t.grad is not None:
                        grad = self._to_device(t.grad, compute)
                        t.grad = None
                        t.grad = grad
                    for holder, key in self._state(t):
                        holder[key] = self._to_device(holder[key], compute)
            event = self.stream.record_event() if self.cuda else None
        self.resident[k] = {"event": event, "full": full}
        self.moves.append(("fetch", k))

    def _ensure(self, k: int, full: bool) -> None:
        """Block k on the device before the compute stream uses it."""
        self._fetch(k, full)
        event = self.resident[k]["event"]
        if event is not None:
            self._compute().wait_event(event)
            self.resident[k]["event"] = None

    def _offload(self, k: int) -> None:
        """Block k back to the host: trained values copied back when they could have changed (a fetch
        for the backward), frozen ones dropped; gradients and optimizer state copied to the host."""
        entry = self.resident.pop(k, None)
        if entry is None:
            return
        if self.cuda:
            self.stream.wait_stream(self._compute())  # after the kernels that use the block
        with self._side():
            for t in self.tensors[k]:
                if entry["full"] and t.requires_grad:  # trained weights are plain tensors (quantized ones are frozen)
                    self.host[id(t)].copy_(t.data, non_blocking=True)
                install(t, self.host[id(t)])
                if id(t) in self.host_states:
                    t.quant_state = self.host_states[id(t)]
                if entry["full"] and isinstance(t, torch.nn.Parameter):
                    grad = t.grad
                    if grad is not None:
                        t.grad = None
                        t.grad = self._to_host(grad)
                    for holder, key in self._state(t):
                        holder[key] = self._to_host(holder[key])
        self.moves.append(("offload", k))

    def _host_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        data = tensor.to(HOST)
        return data.pin_memory() if self.cuda else data

    def _to_device(self, tensor: torch.Tensor, compute) -> torch.Tensor:
        """A copy on the device, made on the side stream (the caller is inside `_side()`)."""
        out = tensor.to(self.device, non_blocking=True, copy=True)
        if compute is not None:
            out.record_stream(compute)  # its memory is not reused before the compute stream is done with it
        return out

    def _to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == HOST and not self.cuda:
            return tensor.clone()
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device=HOST, pin_memory=self.cuda)
        out.copy_(tensor, non_blocking=True)
        if self.cuda:
            tensor.record_stream(self.stream)  # not reused by the compute stream before this copy ends
        return out

    def settle(self) -> None:
        """Every block home and every copy finished (the end of a backward pass)."""
        for k in list(self.resident):
            self._offload(k)
        if self.cuda:
            self.stream.synchronize()

    # ------------------------------------------------------------------ hooks
    def _make_pre(self, k: int):
        def pre(module, args, kwargs):
            if in_backward():  # a checkpointed block recomputed by the backward pass
                self._reach_backward(k)
            else:
                if k == 0 and self.callback_queued:  # a backward pass that failed half-way
                    self._end_backward()
                if k in self.swapped:
                    self._ensure(k, full=False)
                later = [j for j in sorted(self.swapped) if j > k]
                if self.prefetch and later:
                    self._fetch(later[0], full=False)
            if self.move_inputs:
                return _to_device(args, self.device), _to_device(kwargs, self.device)
            return None
        return pre

    def _make_post(self, k: int):
        def post(module, args, output):
            if in_backward():
                return None
            outs = [t for t in _tensors(output) if t.requires_grad] if torch.is_grad_enabled() else []
            for t in outs:
                t.register_hook(lambda grad, k=k: self._reach_backward(k))
            if k in self.swapped and not (outs and k == len(self.blocks) - 1):  # the backward starts there
                self._offload(k)
            return None
        return post

    def _reach_backward(self, k: int) -> None:
        """Autograd reached block k: every later block is done (see the module docstring)."""
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        for j in [j for j in self.resident if j > k]:
            self._offload(j)
        if k in self.swapped:
            self._ensure(k, full=True)
        earlier = [j for j in sorted(self.swapped) if j < k]
        if self.prefetch and earlier:
            self._fetch(earlier[-1], full=True)

    def _end_backward(self) -> None:
        self.callback_queued = False
        self.settle()

    def remove(self) -> None:
        """Remove the hooks and bring every swapped block to the device for good."""
        for h in self.handles:
            h.remove()
        for k in sorted(self.swapped):
            self._ensure(k, full=True)
        self.resident.clear()


def place_without(module: torch.nn.Module, blocks: list[torch.nn.Module], device, dtype=None) -> None:
    """module in `dtype` on `device`, except `blocks` (cast, kept on the host for a BlockSwap)."""
    skip = {id(t) for b in blocks for t in (*b.parameters(), *b.buffers())}
    if dtype is not None:
        module.to(dtype=dtype)
    for t in (*module.parameters(), *module.buffers()):
        if id(t) not in skip:
            t.data = t.data.to(device)


def offload_frozen(modules: list[torch.nn.Module], device) -> list[BlockSwap]:
    """memory.offload_encoders: each frozen module's top-level parts (those with weights) live on the
    host and come to `device` for their own call, inputs moved with them."""
    swaps = []
    for module in modules:
        units = [m for m in module.children() if any(True for _ in m.parameters())]
        if units:
            swaps.append(BlockSwap(units, len(units), device, prefetch=False, move_inputs=True))
    return swaps
