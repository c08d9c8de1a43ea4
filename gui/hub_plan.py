"""The plan's download lines for hub repo ids in the form's model fields: what `python -m trainer_backend
download <id> --plan` says (the size to download, what is cached, the free space), asked in a background
process (the family's detection may import torch, which the studio never does) and kept for 10 minutes, so
the live plan never waits on the network: until the answer comes the line says it is asking."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

from trainer_backend.config import TrainConfig
from trainer_backend.config.paths import PROJECT_ROOT

FRESH_S = 600.0
TIMEOUT_S = 120.0
_answers: dict[tuple[str, str], tuple[float, str]] = {}
_asking: set[tuple[str, str]] = set()
_lock = threading.Lock()


def _ask(spec: str, kind: str, python: str) -> None:
    try:
        proc = subprocess.run([python, "-m", "trainer_backend", "download", spec, "--plan", "--kind", kind],
                              cwd=str(PROJECT_ROOT), capture_output=True, text=True, timeout=TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        out = proc.stdout.strip().splitlines() if proc.returncode == 0 else proc.stderr.strip().splitlines()
        answer = (out[0] if proc.returncode == 0 else out[-1].removeprefix("error: repo: ")) if out else \
            f"{spec}: no answer from `download --plan` (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        answer = f"{spec}: the hub did not answer within {TIMEOUT_S:.0f} s"
    with _lock:
        _answers[(spec, kind)] = (time.monotonic(), answer)
        _asking.discard((spec, kind))


def download_lines(cfg: TrainConfig, python: str = sys.executable, now: float | None = None) -> list[str]:
    """One line per hub id in the config's model fields (none for local paths)."""
    from trainer_backend.model_sources import config_hub_fields
    from trainer_backend.model_sources.config_models import FIELD_KINDS
    now = time.monotonic() if now is None else now
    lines = []
    for key, name, spec in config_hub_fields(cfg):
        if not cfg.model.hub_download:
            lines.append(f"{key}: {spec}: downloads are off (model.hub_download); it must be in the Hugging Face cache")
            continue
        ask = (str(spec), FIELD_KINDS.get(name, "files"))
        with _lock:
            answer = _answers.get(ask)
            if answer is not None and now - answer[0] < FRESH_S:
                lines.append(f"{key}: {answer[1]}")
                continue
            lines.append(f"{key}: {spec}: asking the hub for the download size and checking the free space…")
            if ask in _asking:
                continue
            _asking.add(ask)
        threading.Thread(target=_ask, args=(*ask, python), daemon=True, name="hub-plan").start()
    return lines


def downloads_markdown(cfg: TrainConfig) -> list[str]:
    """The plan's "Downloads" section as markdown lines (empty without hub ids)."""
    lines = download_lines(cfg)
    return ["", "#### Downloads (Hugging Face hub)", "", *[f"{line}  " for line in lines]] if lines else []
