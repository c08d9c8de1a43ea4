"""GPU sets as slots (pure): which waiting jobs start now, on which GPUs.

The slots are the GPUs the studio may use (`--gpus 0,1,2,3`, default every visible GPU) plus one
CPU slot: a job asks for N GPUs (its `[hardware] num_processes`) or for the CPU (`hardware.cpu`,
or a machine without GPUs). Jobs start strictly in queue order: a job waiting for more GPUs than
are free holds back the jobs behind it, so a 4-GPU job is never starved by a stream of 1-GPU ones."""
from __future__ import annotations

CPU = "cpu"


def parse_gpus(text: str | None, visible: int) -> list[str]:
    """`--gpus` ("0,1,3", "" = every visible GPU) -> the GPU slots; an id that is not a number is an error."""
    if not text:
        return [str(i) for i in range(visible)]
    ids = [part.strip() for part in text.split(",") if part.strip()]
    bad = [i for i in ids if not i.isdigit()]
    if bad:
        raise ValueError(f"--gpus: {', '.join(bad)} is not a GPU index (use e.g. --gpus 0,1)")
    return list(dict.fromkeys(ids))


def wanted(gpu_slots: list[str], num_processes: int, cpu: bool) -> int:
    """What a job asks for: N GPUs, or 0 for the CPU slot (forced, or no GPU slots)."""
    return 0 if cpu or not gpu_slots else max(1, num_processes)


def assign(gpu_slots: list[str], busy: list[str], waiting: list[tuple[int, int]]) -> list[tuple[int, list[str]]]:
    """`waiting` = (job id, GPUs wanted, 0 = the CPU slot) in queue order; `busy` = slots in use.
    Returns (job id, its slots) for each job that starts now. A job wanting more GPUs than
    exist can never start: it is skipped (the worker fails it with a message) rather than block all."""
    free = [s for s in gpu_slots if s not in busy]
    cpu_free = CPU not in busy
    starts = []
    for job_id, n in waiting:
        if n == 0:
            if not cpu_free:
                break
            cpu_free = False
            starts.append((job_id, [CPU]))
            continue
        if n > len(gpu_slots):
            continue
        if n > len(free):
            break
        starts.append((job_id, free[:n]))
        free = free[n:]
    return starts


def impossible(gpu_slots: list[str], n: int) -> str:
    """Why a job can never run here, or ''."""
    if n > len(gpu_slots):
        return (f"hardware.num_processes: the job asks for {n} GPUs and this studio has {len(gpu_slots)} "
                f"({', '.join(gpu_slots) or 'none'}; see --gpus)")
    return ""
