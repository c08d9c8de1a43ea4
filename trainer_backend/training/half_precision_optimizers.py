"""Optimizers for weights kept in bf16/fp16 with no fp32 master copy (precision.full_bf16/full_fp16).

Why not plain AdamW on bf16 weights: bf16 has 8 bits of mantissa, so a weight of 1.0 can only
move in steps of 1/128; an update of lr × 1e-3 rounds to nothing and, step after step, most of
training is silently lost. Two remedies, both computed per parameter in fp32 (one parameter's
temporary at a time, so peak memory stays close to the half-precision footprint):

- stochastic rounding (default): the fp32 result is rounded up or down at random, with the
  probability of its distance to each neighbour, so the expected weight is exact and small updates
  survive on average. No extra memory. (Zamirai et al. 2020; Lightning/optimi/torchao use it.)
- Kahan summation: a per-weight compensation buffer in the weights' dtype carries what rounding
  lost into the next step. Most exact; 2 more bytes per weight. (Kahan 1965; optimi's default.)
- nearest: plain rounding, for comparison.

The moments (Adam's m and v, SGD's momentum) are stored in bf16 (fp32's exponent range, so v=g²
does not underflow even for fp16 weights) and written back with the same stochastic rounding
(their small per-step changes would otherwise stagnate). Randomness comes from a private
generator seeded by (seed, step, parameter index): identical on every rank (DDP replicas stay
bitwise equal) and on resume, and the global RNG stream is untouched.

Memory per trained weight: weight 2 + gradient 2 + moments 4 (AdamW) = 8 bytes (10 with Kahan),
against 16 bytes for fp32 master weights with fp32 AdamW.
No installed package offered this for torch 2.13 here (torchao / torch-optimi are not
dependencies), so it is written out: AdamW and SGD(momentum) cover the project's optimizers that
are plain elementwise rules.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch

ROUNDINGS = ("stochastic", "kahan", "nearest")
STATE_DTYPE = torch.bfloat16


def _generator(seed: int, step: int, index: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    return g.manual_seed((seed * 1_000_003 + step * 7_919 + index * 104_729) % (2**63))


def stochastic_round(value: torch.Tensor, dtype: torch.dtype, generator: torch.Generator | None = None
                     ) -> torch.Tensor:
    """fp32 `value` rounded to `dtype` up or down at random, P(up) = distance to the lower
    neighbour / spacing: unbiased, E[result] == value (for finite values in range)."""
    value = value.float()
    if dtype == torch.float32:
        return value
    if dtype == torch.bfloat16:
        # bf16 is the top 16 bits of fp32: add uniform noise to the 16 bits that are dropped, then truncate
        bits = value.view(torch.int32)
        noise = torch.randint(0, 1 << 16, value.shape, dtype=torch.int32, device=value.device, generator=generator)
        rounded = ((bits + noise) & -65536).view(torch.float32)
        return torch.where(torch.isfinite(value), rounded, value).to(dtype)
    nearest = value.to(dtype)
    error = value - nearest.float()
    toward = torch.where(error >= 0, torch.full_like(nearest, math.inf), torch.full_like(nearest, -math.inf))
    other = torch.nextafter(nearest, toward)
    spacing = (other.float() - nearest.float()).abs()
    p_other = torch.where(spacing > 0, error.abs() / spacing, torch.zeros_like(error))
    u = torch.rand(value.shape, device=value.device, generator=generator)
    return torch.where(u < p_other, other, nearest)


class HalfWeightsOptimizer(torch.optim.Optimizer):
    """Base: the fp32 update rule lives in `_update`; this class stores the result into the
    half-precision weight (and the bf16 moments) with the chosen rounding."""

    def __init__(self, params: Iterable, defaults: dict, rounding: str = "stochastic", seed: int = 0):
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        super().__init__(params, defaults)
        self.rounding, self.seed = rounding, seed

    def _store(self, target: torch.Tensor, value: torch.Tensor, generator: torch.Generator) -> None:
        if target.dtype == torch.float32 or self.rounding == "nearest":
            target.copy_(value)
        else:
            target.copy_(stochastic_round(value, target.dtype, generator))

    def _write_weight(self, p: torch.Tensor, new: torch.Tensor, state: dict, generator: torch.Generator) -> None:
        if self.rounding == "kahan" and p.dtype != torch.float32:
            comp = state.setdefault("kahan", torch.zeros_like(p))
            # the intended weight is new + the error carried from the previous steps
            target = new + comp.float()
            rounded = target.to(p.dtype)
            comp.copy_((target - rounded.float()).to(p.dtype))
            p.copy_(rounded)
        else:
            self._store(p, new, generator)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                state = self.state[p]
                state["step"] = state.get("step", 0) + 1
                generator = _generator(self.seed, state["step"], index, p.device)
                new = self._update(p.float(), p.grad.float(), state, group, generator)
                self._write_weight(p, new, state, generator)
        return loss

    def _update(self, w: torch.Tensor, g: torch.Tensor, state: dict, group: dict,
                generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def _moment(self, state: dict, name: str, like: torch.Tensor) -> torch.Tensor:
        if name not in state:
            state[name] = torch.zeros_like(like, dtype=STATE_DTYPE)
        return state[name]

    def load_state_dict(self, state_dict: dict) -> None:
        """torch casts every floating state to the parameter's dtype on load; the moments are
        bf16 whatever the weights are (fp16 would underflow v), so put the saved tensors back."""
        saved = {int(k): dict(v) for k, v in state_dict["state"].items()}
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for i, entries in saved.items():
            if torch.is_tensor(entries.get("step")):  # saved by torch's fused AdamW (optimizer.fused)
                self.state[params[i]]["step"] = int(entries["step"].item())
            for key, value in entries.items():
                if torch.is_tensor(value) and value.is_floating_point() and key in ("exp_avg", "exp_avg_sq",
                                                                                   "momentum"):
                    self.state[params[i]][key] = value.to(device=params[i].device)


class HalfWeightsAdamW(HalfWeightsOptimizer):
    """AdamW (decoupled weight decay, bias correction) computed in fp32 per parameter."""

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, rounding: str = "stochastic", seed: int = 0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), rounding, seed)

    def _update(self, w, g, state, group, generator):
        beta1, beta2 = group["betas"]
        step = state["step"]
        m_store, v_store = self._moment(state, "exp_avg", w), self._moment(state, "exp_avg_sq", w)
        m = m_store.float().mul_(beta1).add_(g, alpha=1 - beta1)
        v = v_store.float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
        self._store(m_store, m, generator)
        self._store(v_store, v, generator)
        if group["weight_decay"]:
            w = w.mul_(1 - group["lr"] * group["weight_decay"])
        denom = (v / (1 - beta2 ** step)).sqrt_().add_(group["eps"])
        return w.addcdiv_(m, denom, value=-group["lr"] / (1 - beta1 ** step))


class HalfWeightsSGD(HalfWeightsOptimizer):
    """SGD with (heavy-ball) momentum and L2 weight decay, like torch.optim.SGD, in fp32."""

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
                 rounding: str = "stochastic", seed: int = 0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay), rounding, seed)

    def _update(self, w, g, state, group, generator):
        if group["weight_decay"]:
            g = g.add(w, alpha=group["weight_decay"])
        if group["momentum"]:
            buf_store = self._moment(state, "momentum", w)
            buf = g if state["step"] == 1 else buf_store.float().mul_(group["momentum"]).add_(g)
            self._store(buf_store, buf, generator)
            g = buf
        return w.add_(g, alpha=-group["lr"])


def cast_trainable(params: Iterable[torch.nn.Parameter], dtype: torch.dtype) -> None:
    """The trained weights themselves in `dtype` (their gradients follow)."""
    for p in params:
        p.data = p.data.to(dtype)
        if p.grad is not None:
            p.grad = p.grad.to(dtype)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by the optimizer's state tensors (for the memory benchmark)."""
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if torch.is_tensor(v))
