"""Device helpers that work on CUDA, ROCm (which PyTorch reports as CUDA), MPS, XPU and the CPU.

The rest of the backend never names a device type: the device, the dtype and autocast come from
accelerate (`accelerator.device`, `accelerator.autocast()`), and memory statistics, cache clearing
and peak-memory measurement go through these functions. This is the one module allowed to
spell out backend names (tests/test_devices.py greps the package for strays).

On the CPU "memory" is the process's resident set: the current RSS, and its high-water mark
(Linux VmHWM, which `reset_peak_memory` resets through /proc/self/clear_refs; elsewhere the
never-reset `ru_maxrss`).
"""
from __future__ import annotations

import os
import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

_ACCELERATOR_TYPES = ("cuda", "mps", "xpu")


def as_device(device: torch.device | str | None = None) -> torch.device:
    """A torch.device; None means the current accelerator, else the CPU."""
    if device is None:
        acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        return torch.device(acc.type if acc is not None else "cpu")
    return device if isinstance(device, torch.device) else torch.device(device)


def device_kind(device: torch.device | str | None = None) -> str:
    """"cuda", "rocm", "mps", "xpu" or "cpu" (ROCm devices are torch "cuda" devices on a HIP build)."""
    dev = as_device(device)
    if dev.type == "cuda" and getattr(torch.version, "hip", None):
        return "rocm"
    return dev.type if dev.type in _ACCELERATOR_TYPES else "cpu"


def is_cuda(device: torch.device | str) -> bool:
    """A CUDA (or ROCm) device, as named by a user ("cuda", "cuda:1"); for libraries that only speak CUDA
    (bitsandbytes, onnxruntime's CUDA provider)."""
    return as_device(device).type == "cuda"


def cuda_available() -> bool:
    return torch.cuda.is_available()


def _is_accelerator(dev: torch.device) -> bool:
    return dev.type in _ACCELERATOR_TYPES and torch.accelerator.is_available()


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor onto `device` without making the host wait: on CUDA through pinned memory with
    a non-blocking copy (a copy from pageable memory waits for the stream: the H100 profile of an
    SDXL step counted 8 such waits against the diffusers example's 3, each one stalling a step that
    is bound by how fast the host queues kernels); elsewhere a plain `.to`."""
    dev = as_device(device)
    if dev.type != "cuda" or t.device.type != "cpu":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


def side_stream(device: torch.device | str) -> "torch.cuda.Stream | None":
    """A second stream for copies beside the computation (block swap), where the device has streams
    (CUDA); None elsewhere, where copies simply run in order."""
    dev = as_device(device)
    return torch.cuda.Stream(dev) if dev.type == "cuda" else None


def compute_stream(device: torch.device | str) -> "torch.cuda.Stream | None":
    """The stream the computation runs on (None where the device has no streams)."""
    dev = as_device(device)
    return torch.cuda.current_stream(dev) if dev.type == "cuda" else None


def on_stream(stream):
    """Run the block's work on `stream` (a no-op context for None)."""
    import contextlib
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued kernels (before reading a timer or a memory counter)."""
    dev = as_device(device)
    if _is_accelerator(dev):
        torch.accelerator.synchronize(dev)


def empty_cache(device: torch.device | str | None = None) -> None:
    """Give cached, unused accelerator memory back to the driver (a no-op on the CPU)."""
    dev = as_device(device)
    if _is_accelerator(dev):
        torch.accelerator.empty_cache()


def _proc_status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_rss_bytes() -> int:
    """Current resident set size of this process."""
    kb = _proc_status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    import psutil
    return int(psutil.Process().memory_info().rss)


def cpu_peak_rss_bytes() -> int:
    """High-water mark of the resident set (since start or the last reset_peak_memory)."""
    kb = _proc_status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB


def reset_peak_memory(device: torch.device | str | None = None) -> bool:
    """Start a new peak measurement; False when this platform cannot reset it (CPU off Linux)."""
    dev = as_device(device)
    if _is_accelerator(dev):
        if dev.type == "mps":
            return False  # MPS keeps no peak counter; peak_memory_bytes reports the current use
        torch.accelerator.reset_peak_memory_stats(dev)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # "5" resets VmHWM to the current RSS (Linux ≥ 4.0)
        return True
    except OSError:
        return False


def peak_memory_bytes(device: torch.device | str | None = None) -> int:
    """Peak memory since the last reset: allocated tensor bytes on CUDA/ROCm/XPU, the driver's
    current allocation on MPS, the peak resident set on the CPU."""
    dev = as_device(device)
    if _is_accelerator(dev):
        if dev.type == "mps":
            return int(torch.mps.driver_allocated_memory())
        return int(torch.accelerator.max_memory_allocated(dev))
    return cpu_peak_rss_bytes()


@dataclass
class MemoryStats:
    kind: str            # see device_kind
    allocated: int       # bytes held by tensors (CPU: resident set)
    reserved: int        # bytes held by the caching allocator (CPU: resident set)
    peak: int            # see peak_memory_bytes
    total: int           # device memory (CPU: physical RAM); 0 when unknown

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        gib = 1024 ** 3
        total = f" of {self.total / gib:.1f} GiB" if self.total else ""
        return (f"{self.kind}: {self.allocated / gib:.2f} GiB allocated, {self.reserved / gib:.2f} GiB reserved, "
                f"peak {self.peak / gib:.2f} GiB{total}")


def memory_stats(device: torch.device | str | None = None) -> MemoryStats:
    """Memory in use on the device (for logs, OOM advice and benchmarks)."""
    dev = as_device(device)
    kind = device_kind(dev)
    if _is_accelerator(dev):
        if dev.type == "mps":
            current = int(torch.mps.current_allocated_memory())
            driver = int(torch.mps.driver_allocated_memory())
            total = int(getattr(torch.mps, "recommended_max_memory", lambda: 0)())
            return MemoryStats(kind, current, driver, driver, total)
        _, total = torch.accelerator.get_memory_info(dev)
        return MemoryStats(kind, int(torch.accelerator.memory_allocated(dev)),
                           int(torch.accelerator.memory_reserved(dev)),
                           int(torch.accelerator.max_memory_allocated(dev)), int(total))
    rss = cpu_rss_bytes()
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 0
    return MemoryStats(kind, rss, rss, cpu_peak_rss_bytes(), int(total))


def cuda_capability(device: torch.device | str) -> tuple[tuple[int, int], str] | None:
    """(compute capability, card name) of a CUDA device; None elsewhere."""
    if not is_cuda(device):
        return None
    dev = torch.device(device)
    return tuple(torch.cuda.get_device_capability(dev)), torch.cuda.get_device_name(dev)


def allow_cudnn_attention(allowed: bool) -> None:
    """Whether scaled_dot_product_attention may pick cuDNN's kernel (process-wide; it exists on CUDA
    only, so elsewhere this changes nothing). precision.attention = "sdpa" leaves it out: on an H200
    with torch 2.11 it was PyTorch's first choice for Flux.1's attention and its backward corrupted
    training (NaN loss at step 2), while the flash and memory-efficient kernels trained cleanly."""
    torch.backends.cuda.enable_cudnn_sdp(allowed)


def accelerator_rng_state() -> tuple[str, object] | None:
    """The accelerator's RNG state(s) (every device of the current type), or None on the CPU;
    torch's CPU generator is saved with torch.get_rng_state() as usual."""
    if not torch.accelerator.is_available():
        return None
    kind = torch.accelerator.current_accelerator().type
    module = torch.get_device_module(kind)
    getter = getattr(module, "get_rng_state_all", None) or getattr(module, "get_rng_state", None)
    return (kind, getter()) if getter is not None else None


def set_accelerator_rng_state(state: tuple[str, object] | None) -> None:
    """Restore what accelerator_rng_state returned (None: nothing to restore)."""
    if state is None:
        return
    kind, value = state
    module = torch.get_device_module(kind)
    setter = getattr(module, "set_rng_state_all", None) if isinstance(value, (list, tuple)) else None
    (setter or module.set_rng_state)(value)
