"""model.quantize = int8_compute / float8_compute: the frozen base's Linear layers multiply in 8 bits.

The storage kinds (compute/quantize.py) keep weights small but multiply in the compute dtype after
dequantizing; these modes also run the matmul itself in 8 bits. Each frozen Linear of the denoiser is
replaced by a `LowBitLinear` that holds its weight as int8 or float8 e4m3 with one fp32 scale per output
row. The forward scales each activation row by its absolute maximum, multiplies with `torch._int_mm`
(int32 accumulate) or `torch._scaled_mm` (row-wise scales) and rescales; the backward gives the layer
input its gradient through the dequantized weight in the compute dtype (a LoRA on the layer needs it;
torchao's dynamic int8 layer does not backpropagate to its input). The frozen weight gets no gradient.

Where peft wrapped a layer with its lora.Linear, the wrapper's `base_layer` is replaced (after the
adapters were added), so the adapters, the saved LoRA file and the checkpoints are those of an
unquantized run. Shapes the 8-bit kernels refuse (few rows, widths not multiples of 8/16) take the
dequantized matmul instead.
"""
from __future__ import annotations

import logging

import torch

from ..errors import ConfigError
from .devices import cuda_capability

LOG = logging.getLogger("trainer")
COMPUTE_KINDS = ("int8_compute", "float8_compute")
INT8_MAX = 127.0
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0          # largest finite float8 e4m3 value
FP8_CAPABILITY = (8, 9)  # Ada (L40S, RTX 40xx) and Hopper (H100/H200) have float8 tensor cores
EPS = 1e-12
_WARNED: set[tuple] = set()   # (kind, device type, dtype): a refused kernel is said once per run, not per layer


def kernel_fits(kind: str, rows: int, k: int, n: int) -> bool:
    """Whether the 8-bit kernel takes a (rows x k) @ (k x n) product: `torch._int_mm` on CUDA needs more
    than 16 rows and k, n multiples of 8; `torch._scaled_mm` needs k, n multiples of 16. The same rule on
    every device, so a CPU test takes the path a GPU would."""
    if kind == "int8_compute":
        return rows > 16 and k % 8 == 0 and n % 8 == 0
    return rows > 0 and k % 16 == 0 and n % 16 == 0


def quantize_rows(t: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise absmax quantization of a 2-D tensor: (int8 or float8 values, fp32 scale per row, shape (rows, 1))."""
    t32 = t.float()
    top = INT8_MAX if kind == "int8_compute" else FP8_MAX
    scale = t32.abs().amax(dim=1, keepdim=True).clamp(min=EPS) / top
    scaled = t32 / scale
    if kind == "int8_compute":
        return scaled.round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize(qweight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (qweight.float() * scale).to(dtype)


def lowbit_matmul(x2: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, kind: str) -> torch.Tensor:
    """(rows x k) activations times the stored (n x k) weight, in 8 bits; the result in x2's dtype."""
    xq, xs = quantize_rows(x2, kind)
    # row-major, as both kernels require: inductor may otherwise lay a fused producer's output out column-major
    # (speed.compile with float8_compute on SDXL's proj_in after GroupNorm + permute: "mat_a must be row_major")
    xq = xq.contiguous()
    if kind == "int8_compute":
        acc = torch._int_mm(xq, qweight.t())
        return (acc.float() * xs * scale.t()).to(x2.dtype)
    return torch._scaled_mm(xq, qweight.t(), scale_a=xs, scale_b=scale.t().contiguous(), out_dtype=x2.dtype)


class _LowBitLinearFn(torch.autograd.Function):
    """Forward in 8 bits; backward: grad_input = grad_out @ dequantized weight (no weight gradient: frozen)."""

    @staticmethod
    def forward(ctx, x, qweight, scale, bias, kind, use_kernel):
        ctx.save_for_backward(qweight, scale)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if use_kernel:
            out = lowbit_matmul(x2, qweight, scale, kind)
        else:
            out = x2 @ dequantize(qweight, scale, x.dtype).t()
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out.reshape(*shape[:-1], qweight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        qweight, scale = ctx.saved_tensors
        grad_in = None
        if ctx.needs_input_grad[0]:
            grad_in = grad_out @ dequantize(qweight, scale, grad_out.dtype)
        return grad_in, None, None, None, None, None


class LowBitLinear(torch.nn.Module):
    """A frozen Linear whose weight is stored as int8/float8 + a row scale and whose matmul runs in 8 bits."""

    def __init__(self, linear: torch.nn.Linear, kind: str):
        super().__init__()
        if kind not in COMPUTE_KINDS:
            raise ValueError(f"unknown compute kind {kind!r}")
        self.kind, self.in_features, self.out_features = kind, linear.in_features, linear.out_features
        self.compute_dtype = linear.weight.dtype
        qweight, scale = quantize_rows(linear.weight.detach(), kind)
        # not persistent: the base model comes from model.path on every start; checkpoints hold adapters only
        self.register_buffer("qweight", qweight, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.bias = (None if linear.bias is None
                     else torch.nn.Parameter(linear.bias.detach().clone(), requires_grad=False))
        self._kernel_failed: set[tuple] = set()

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (peft's DoRA norm and merges read it); not a parameter, nothing trains it."""
        return dequantize(self.qweight, self.scale, self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        shape_key = (x.device.type, x.dtype, rows)
        use = kernel_fits(self.kind, rows, self.in_features, self.out_features) and shape_key not in self._kernel_failed
        if use:
            try:
                return _LowBitLinearFn.apply(x, self.qweight, self.scale, self.bias, self.kind, True)
            except (RuntimeError, NotImplementedError) as e:  # a device/dtype the kernel does not take: once per shape
                self._kernel_failed.add(shape_key)
                if (self.kind, x.device.type, x.dtype) not in _WARNED:
                    _WARNED.add((self.kind, x.device.type, x.dtype))
                    LOG.warning("model.quantize = %s: the 8-bit kernel refused %s x %d x %d on %s %s (%s); such "
                                "layers multiply the dequantized weight instead", self.kind, rows, self.in_features,
                                self.out_features, x.device.type, str(x.dtype).removeprefix("torch."),
                                str(e).splitlines()[0][:160])
        return _LowBitLinearFn.apply(x, self.qweight, self.scale, self.bias, self.kind, False)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}"


def check_device(kind: str, device: torch.device | str) -> None:
    """float8_compute needs float8 matmuls: CUDA compute capability 8.9+ (L40S, RTX 40xx, H100/H200);
    the CPU runs them (slowly; for tests)."""
    card = cuda_capability(device) if kind == "float8_compute" else None
    if card is None:
        return
    capability, name = card
    if capability < FP8_CAPABILITY:
        raise ConfigError(f"model.quantize: float8_compute needs float8 matmuls (compute capability 8.9+: L40S, "
                          f"RTX 40xx, H100/H200); {name} has {capability[0]}.{capability[1]}: use int8_compute")


def to_lowbit_compute(module: torch.nn.Module, kind: str, keep=()) -> int:
    """Replace the frozen plain Linear layers of `module` (peft lora.Linear wrappers' base layers
    included) by LowBitLinear, except those `keep` names (training/quantize.kept). Returns the count."""
    from .quantize import MARK, kept
    patterns = (*keep, *(getattr(module, "_keep_in_fp32_modules", None) or ()))
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    check_device(kind, device)
    _WARNED.clear()   # a new run says a refused kernel again
    swapped = 0
    for name, layer in list(module.named_modules()):
        for child_name, child in list(layer.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            clean = full.replace(".base_layer", "")
            if type(child) is not torch.nn.Linear or child.weight.requires_grad or kept(clean, patterns):
                continue
            setattr(layer, child_name, LowBitLinear(child, kind))
            swapped += 1
    setattr(module, MARK, kind)
    LOG.info("model.quantize = %s: %d frozen linear layers of the %s multiply in 8 bits", kind, swapped,
             type(module).__name__)
    return swapped
