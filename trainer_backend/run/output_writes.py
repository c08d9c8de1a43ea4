"""The run's outputs (the LoRA file, a full fine-tune's folder) written with the checkpoint's
treatment of a full disk: what could not be written and where, the free space, that the last
checkpoint is intact and what to do; what the failed write left half-written is removed (only
files of this run's output name that the write created or changed)."""
from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Callable

from .checkpoint_files import list_checkpoints

DISK_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
DISK_TEXTS = ("No space left on device", "File too large", "Disk quota exceeded", "StorageFull", "code: 28",
              "code: 27")


class OutputWriteError(RuntimeError):
    """The outputs could not be written (disk full, a file-size limit); the last checkpoint is intact."""


def is_disk_error(error: BaseException) -> bool:
    """A write that failed for room: OSError's errno, or the text safetensors/torch wrap it in."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_ERRNOS:
            return True
        if any(text in str(error) for text in DISK_TEXTS):
            return True
        error = error.__cause__ or error.__context__
    return False


def _snapshot(run_dir: Path, name: str) -> dict[Path, int]:
    out = {}
    try:
        entries = [p for p in Path(run_dir).iterdir() if p.name.startswith(name)]
    except OSError:
        return out
    for path in entries:
        try:
            out[path] = path.stat().st_mtime_ns
        except OSError:
            pass
    return out


def written_or_explained(run_dir: Path, name: str, write: Callable[[], list[str]]) -> list[str]:
    """write(); a failure for room becomes one OutputWriteError line (after removing what it left
    half-written), any other error is raised as it is."""
    before = _snapshot(run_dir, name)
    try:
        return write()
    except Exception as e:
        if not is_disk_error(e):
            raise
        left = [p for p, mtime in _snapshot(run_dir, name).items() if before.get(p) != mtime]
        for path in left:  # only this run's output names, created or changed by this write
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        try:
            free = f"{shutil.disk_usage(run_dir).free / 1e6:,.0f} MB free on that disk"
        except OSError:
            free = "free space unknown"
        checkpoints = list_checkpoints(run_dir)
        kept = (f"the last checkpoint {checkpoints[-1]} is intact: free disk space and start the run again, it "
                "resumes from there and writes the outputs" if checkpoints else
                "no checkpoint was kept (checkpoints.at_end is off): free disk space and train again")
        removed = f"; removed the partial {', '.join(p.name for p in left)}" if left else ""
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise OutputWriteError(f"could not write the outputs in {run_dir} ({reason}; {free}{removed}); {kept}") from None
