"""precision.attention = flash_attn3 | flash_attn2 | sdpa_flash | sdpa_efficient | sdpa_cudnn_only: one
attention kernel, checked once per shape against PyTorch's math kernel before it is used.

Every family's attention ends in `torch.nn.functional.scaled_dot_product_attention` (diffusers'
AttnProcessor2_0 and its attention dispatcher's native backend look it up at call time), so while such
a choice is active that function is replaced by `checked_sdpa`: for each new (shapes, dtype, device,
mask, causal, scale) key it runs the chosen kernel and the math kernel on random inputs of that shape,
forward and backward (as bench/gpubench/sdpa_check.py does), and uses the kernel only when every output
and gradient is finite and within CHECK_RTOL of the math kernel's; otherwise (kernel unavailable, the
package not installed, an error, a wrong result) that key falls back to PyTorch's own choice (cuDNN
left out, as precision.attention = "sdpa") with one log line. The FlashAttention packages (`flash_attn`
2, `flash_attn_interface` 3) are used only when installed; they are not dependencies.
"""
from __future__ import annotations

import contextlib
import importlib
import logging

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

LOG = logging.getLogger("trainer")
CHECKED = ("flash_attn3", "flash_attn2", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn_only")
SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "sdpa_cudnn_only": SDPBackend.CUDNN_ATTENTION}
FLASH_MODULES = {"flash_attn3": "flash_attn_interface", "flash_attn2": "flash_attn"}
CHECK_RTOL = 2e-2   # bf16 kernels at full-size shapes: ~4e-3 on an H200 (bench/gpubench/sdpa_check.py)

_original = F.scaled_dot_product_attention
_state = {"choice": "", "verdicts": {}}   # verdicts: key -> bool (the kernel passed its check)


class Unusable(Exception):
    """The kernel cannot run these inputs (not installed, no kernel for the device/shape, a mask)."""


def _flash_attn_call(choice: str, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    if attn_mask is not None or kw.get("enable_gqa"):
        raise Unusable("FlashAttention takes no attention mask here")
    try:
        module = importlib.import_module(FLASH_MODULES[choice])
    except ImportError:
        raise Unusable(f"the {FLASH_MODULES[choice]} package is not installed") from None
    # FlashAttention's layout is (batch, tokens, heads, dim); SDPA's (batch, heads, tokens, dim)
    out = module.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 softmax_scale=scale, causal=is_causal,
                                 **({"dropout_p": dropout_p} if choice == "flash_attn2" else {}))
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2)


def run_kernel(choice: str, *args, **kwargs) -> torch.Tensor:
    """`choice`'s kernel on SDPA's arguments; Unusable when it cannot run them."""
    if choice in FLASH_MODULES:
        return _flash_attn_call(choice, *args, **kwargs)
    try:
        with sdpa_kernel([SDPA_BACKENDS[choice]]):
            return _original(*args, **kwargs)
    except RuntimeError as e:
        raise Unusable(str(e).splitlines()[0][:160]) from None


def _key(q, k, v, attn_mask, dropout_p, is_causal, scale) -> tuple:
    return (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, q.device.type,
            None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype), float(dropout_p),
            bool(is_causal), scale)


def check(choice: str, q, k, v, attn_mask=None, is_causal=False, scale=None, **kw) -> tuple[bool, str]:
    """Forward and backward of `choice` vs the math kernel (fp32) on random inputs of these shapes."""
    gen = torch.Generator(device=q.device).manual_seed(0)
    leaves = [torch.randn(t.shape, generator=gen, device=t.device).to(t.dtype).requires_grad_() for t in (q, k, v)]
    grad = torch.randn(q.shape[:-1] + v.shape[-1:], generator=gen, device=q.device)
    mask = None if attn_mask is None else attn_mask.detach()
    try:
        with torch.enable_grad():
            out = run_kernel(choice, *leaves, attn_mask=mask, is_causal=is_causal, scale=scale, **kw)
            out.backward(grad.to(out.dtype))
    except Unusable as e:
        return False, str(e)
    except (RuntimeError, TypeError, ValueError) as e:
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    ref = [t.detach().float().requires_grad_() for t in leaves]
    with torch.enable_grad(), sdpa_kernel([SDPBackend.MATH]):
        ref_mask = mask if mask is None or mask.dtype == torch.bool else mask.float()
        ref_out = _original(*ref, attn_mask=ref_mask, is_causal=is_causal, scale=scale, **kw)
        ref_out.backward(grad)
    out, ref_out = out.detach(), ref_out.detach()
    errors = {"out": (out.float() - ref_out).norm() / ref_out.norm().clamp(min=1e-12)}
    errors.update({f"d{n}": (t.grad.float() - r.grad).norm() / r.grad.norm().clamp(min=1e-12)
                   for n, t, r in zip("qkv", leaves, ref)})
    worst = max(float(e) for e in errors.values())
    finite = all(bool(torch.isfinite(t).all()) for t in (out, *(t.grad for t in leaves)))
    ok = finite and worst <= CHECK_RTOL
    return ok, f"largest relative error {worst:.1e} (forward and backward){'' if finite else ', not finite'}"


def _keep(t):
    return t


@torch.compiler.disable  # the check and its log line run eagerly, once per key, outside a compiled block
def _judge(choice: str, key: tuple, query, k, v, attn_mask, dropout_p, is_causal, scale, kw) -> bool:
    if dropout_p:
        verdict, why = False, "attention dropout is not checked"
    else:
        # the check's own autograd keeps its tensors itself: inside a checkpointed block (gradient
        # checkpointing) the block's hooks would count them, and its recomputation runs no check
        with torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
            verdict, why = check(choice, query, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, **kw)
    _state["verdicts"][key] = verdict
    shape, dtype = "x".join(map(str, query.shape)), str(query.dtype).removeprefix("torch.")
    if verdict:
        LOG.info("precision.attention = %s: checked at %s %s against the math kernel (%s); using it",
                 choice, shape, dtype, why)
    else:
        LOG.warning("precision.attention = %s: not used at %s %s (%s); PyTorch's SDPA choice (no cuDNN) instead",
                    choice, shape, dtype, why)
    return verdict


def checked_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """scaled_dot_product_attention through the chosen kernel where its check passed for this key."""
    choice = _state["choice"]
    k = _key(query, key, value, attn_mask, dropout_p, is_causal, scale)
    verdict = _state["verdicts"].get(k)
    if verdict is None:
        verdict = _judge(choice, k, query, key, value, attn_mask, dropout_p, is_causal, scale, kw)
    if verdict:
        return run_kernel(choice, query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                          is_causal=is_causal, scale=scale, **kw)
    return _original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                     scale=scale, **kw)


def use(choice: str) -> None:
    """Make `choice` this process's attention: a CHECKED kernel installs checked_sdpa (verdicts start
    afresh); any other choice puts PyTorch's own function back."""
    _state["verdicts"] = {}
    _state["choice"] = choice if choice in CHECKED else ""
    F.scaled_dot_product_attention = checked_sdpa if choice in CHECKED else _original


@contextlib.contextmanager
def using(choice: str):
    """`use(choice)` for a block; PyTorch's own function afterwards (tests, in-process runs)."""
    use(choice)
    try:
        yield
    finally:
        use("")
