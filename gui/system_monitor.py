"""GPUs (pynvml, where an NVIDIA driver is present) and CPU/RAM/disk (psutil)."""
from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

_NVML_LOCK = threading.Lock()
_NVML_STATE: dict = {"ready": None, "error": ""}
_CPU_LOCK = threading.Lock()
_CPU = {"at": None, "value": 0.0}
CPU_MIN_INTERVAL_S = 0.5   # shorter windows say little (and psutil's very first says 0)


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_total_gb: float
    memory_used_gb: float
    utilization: int | None
    temperature: int | None


def _nvml():
    """pynvml initialised once, or None (no driver: NVMLError_LibraryNotFound and friends)."""
    with _NVML_LOCK:
        if _NVML_STATE["ready"] is None:
            try:
                import pynvml
                pynvml.nvmlInit()
                _NVML_STATE["ready"] = pynvml
            except Exception as e:  # no library, no driver, no permission: no GPUs to show
                _NVML_STATE["ready"] = False
                _NVML_STATE["error"] = f"{type(e).__name__}"
        return _NVML_STATE["ready"] or None


def gpus() -> list[GpuInfo]:
    nv = _nvml()
    if nv is None:
        return []
    out = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h).gpu
            except Exception:
                util = None
            try:
                temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            except Exception:
                temp = None
            out.append(GpuInfo(i, name.decode() if isinstance(name, bytes) else str(name),
                               mem.total / 2**30, mem.used / 2**30, util, temp))
    except Exception:
        return out
    return out


def gpu_count() -> int:
    return len(gpus())


def gpus_markdown(infos: list[GpuInfo] | None = None) -> str:
    infos = gpus() if infos is None else infos
    if not infos:
        why = f" ({_NVML_STATE['error']})" if _NVML_STATE["error"] else ""
        return f"No NVIDIA GPU detected{why}: training runs on the CPU (slow; fine for the demo)."
    rows = ["| GPU | name | memory | utilisation | temperature |", "|---|---|---|---|---|"]
    for g in infos:
        util = f"{g.utilization} %" if g.utilization is not None else "–"
        temp = f"{g.temperature} °C" if g.temperature is not None else "–"
        rows.append(f"| {g.index} | {g.name} | {g.memory_used_gb:.1f} / {g.memory_total_gb:.1f} GB | {util} | {temp} |")
    return "\n".join(rows)


def cpu_percent() -> float:
    """System CPU use over at least CPU_MIN_INTERVAL_S. psutil measures since its previous call
    (the first call returns 0.0, and every page or session calling it shortens the window), so
    one shared measurement is kept: the first call waits for a real window, later calls reuse the
    last value until a new window is long enough."""
    with _CPU_LOCK:
        now = time.monotonic()
        if _CPU["at"] is None:
            psutil.cpu_percent(interval=None)
            time.sleep(CPU_MIN_INTERVAL_S)
            _CPU.update(at=time.monotonic(), value=psutil.cpu_percent(interval=None))
        elif now - _CPU["at"] >= CPU_MIN_INTERVAL_S:
            _CPU.update(at=now, value=psutil.cpu_percent(interval=None))
        return _CPU["value"]


def system_markdown(runs_dir: Path) -> str:
    """GPU table plus CPU, RAM and the free space where runs are written."""
    cpu = cpu_percent()
    mem = psutil.virtual_memory()
    folder = Path(runs_dir)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    disk = shutil.disk_usage(folder)
    lines = [gpus_markdown(), "",
             f"**CPU** {cpu:.0f} % of {psutil.cpu_count()} cores · "
             f"**RAM** {(mem.total - mem.available) / 2**30:.1f} / {mem.total / 2**30:.1f} GB · "
             f"**Disk** ({folder}) {disk.free / 2**30:.1f} GB free of {disk.total / 2**30:.1f} GB"]
    return "\n".join(lines)
