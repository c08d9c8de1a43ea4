"""Hub repos into the standard Hugging Face cache (HF_HOME / HF_HUB_CACHE), through huggingface_hub.

One download of a repo at a time (a file lock: a second process waits, then finds the files cached);
what a model needs only (the family picks the files); a plan with the size to download and the free
space before anything starts; progress per file. A stopped download resumes: huggingface_hub 2.4 deletes
its partial files when a download fails (huggingface_hub#4228), so plain-HTTP files are streamed by its
`http_get` into a partial file of our own beside the blob, kept across runs and continued with a Range
request, then renamed to the blob huggingface_hub would have written; Xet-stored files go through
`hf_hub_download` itself. A completed download is recorded, so later uses need no network.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from .messages import describe, offline_message
from .progress import DownloadStatus, Meter, Progress, SilentBar, bar_class, human_bytes
from .spec import HubSpec

PROBE_FILES = ("model_index.json", "*/config.json")   # enough for a family to recognise a pipeline repo
PARTIAL_SUFFIX = ".sd-studio-partial"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class HubSettings:
    endpoint: str
    cache_dir: Path
    offline: bool

    @classmethod
    def from_env(cls, offline: bool = False) -> "HubSettings":
        """Read at call time (huggingface_hub reads its constants at import): HF_ENDPOINT, HF_HUB_CACHE or
        HF_HOME/hub, HF_HUB_OFFLINE."""
        from huggingface_hub import constants
        env = os.environ
        cache = env.get("HF_HUB_CACHE") or (str(Path(env["HF_HOME"]).expanduser() / "hub") if env.get("HF_HOME")
                                             else constants.HF_HUB_CACHE)
        hub_offline = env.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE or bool(constants.HF_HUB_OFFLINE)
        return cls((env.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/"), Path(cache).expanduser(),
                   offline or hub_offline)


@dataclass
class RepoFile:
    name: str
    size: int
    cached: bool


@dataclass
class DownloadPlan:
    spec: HubSpec
    commit: str
    files: list[RepoFile]
    cache_dir: Path
    free_bytes: int
    family: str = ""                     # the family that chose the files ("" = not a pipeline)
    skipped: int = 0                     # repo files not needed

    @property
    def download_bytes(self) -> int:
        return sum(f.size for f in self.files if not f.cached)

    @property
    def cached_bytes(self) -> int:
        return sum(f.size for f in self.files if f.cached)

    def line(self) -> str:
        who = f" ({self.family} files only; {self.skipped} other files of the repo skipped)" if self.family else ""
        return (f"{self.spec}: download {human_bytes(self.download_bytes)} in "
                f"{sum(not f.cached for f in self.files)} files{who}, {human_bytes(self.cached_bytes)} already "
                f"cached; free space in {self.cache_dir}: {human_bytes(self.free_bytes)}")


# ---- where things are
def storage_folder(settings: HubSettings, spec: HubSpec) -> Path:
    from huggingface_hub.file_download import repo_folder_name
    return settings.cache_dir / repo_folder_name(repo_id=spec.repo_id, repo_type="model")


def free_space(folder: Path) -> int:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _record_path(settings: HubSettings, spec: HubSpec, selection: str) -> Path:
    from ..families.builtin import cache_root
    key = hashlib.sha1(f"{settings.cache_dir}\0{spec.repo_id}\0{spec.revision}\0{selection}".encode()).hexdigest()
    return cache_root().parent / "hub-downloads" / f"{key}.json"


def cached_snapshot(settings: HubSettings, spec: HubSpec, selection: str) -> Path | None:
    """The snapshot folder of a completed earlier download with the same selection, if every file is
    still there (no network)."""
    try:
        record = json.loads(_record_path(settings, spec, selection).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    folder = storage_folder(settings, spec) / "snapshots" / str(record.get("commit", ""))
    files = record.get("files") or []
    return folder if files and all((folder / name).is_file() for name in files) else None


def _write_record(settings: HubSettings, spec: HubSpec, selection: str, plan: DownloadPlan) -> None:
    path = _record_path(settings, spec, selection)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"repo": spec.repo_id, "revision": spec.revision, "commit": plan.commit,
                               "files": [f.name for f in plan.files]}), encoding="utf-8")
    os.replace(tmp, path)


# ---- the plan
Selector = Callable[[list[str], Callable[[list[str]], Path]], tuple[list[str], str]]


def make_plan(spec: HubSpec, settings: HubSettings, token: str | None, select: Selector, key: str) -> DownloadPlan:
    """Resolve the revision, list the repo, let `select(names, fetch)` choose the files (fetch downloads
    small files, e.g. model_index.json, and returns the snapshot folder), and size what is missing."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.hf_api import RepoFile as HubFile
    api = HfApi(endpoint=settings.endpoint, token=token)
    commit = spec.revision if _COMMIT.match(spec.revision) else api.model_info(spec.repo_id,
                                                                               revision=spec.revision).sha
    tree = [f for f in api.list_repo_tree(spec.repo_id, revision=commit, recursive=True) if isinstance(f, HubFile)]
    listing = {f.path: (f.lfs.size if f.lfs else f.size) for f in tree}
    blob_names = {f.path: (f.lfs.sha256 if f.lfs else f.blob_id) for f in tree}  # huggingface_hub's blob = etag
    snapshot = storage_folder(settings, spec) / "snapshots" / commit
    blobs = storage_folder(settings, spec) / "blobs"

    def fetch(names: list[str]) -> Path:
        for name in names:
            hf_hub_download(spec.repo_id, name, revision=commit, cache_dir=settings.cache_dir,
                            endpoint=settings.endpoint, token=token, tqdm_class=SilentBar)
        return snapshot

    chosen, family = select(sorted(listing), fetch)
    missing = [name for name in chosen if name not in listing]
    if missing:
        raise ConfigError(f"{key}: {spec.repo_id} has no file {missing[0]!r} at revision {spec.revision!r}")
    if not chosen:
        raise ConfigError(f"{key}: nothing in {spec.repo_id} that a model needs ({len(listing)} files, none chosen)")
    files = [RepoFile(name, listing[name], (snapshot / name).is_file() or (blobs / str(blob_names[name])).is_file())
             for name in chosen]
    return DownloadPlan(spec, commit, files, settings.cache_dir, free_space(settings.cache_dir), family,
                        skipped=len(listing) - len(chosen))


def check_space(plan: DownloadPlan, key: str, margin: int = 256 * 1024 ** 2) -> None:
    need = plan.download_bytes
    if need and need + margin > plan.free_bytes:
        raise ConfigError(f"{key}: {plan.spec} needs {human_bytes(need)} of downloads but {plan.cache_dir} has "
                          f"{human_bytes(plan.free_bytes)} free; free some space or point HF_HOME at a bigger disk")


# ---- the download
@dataclass
class Transfer:
    """Progress of one plan's download, fed by each file's bar."""
    plan: DownloadPlan
    progress: Progress
    clock: Callable[[], float] = time.monotonic
    meter: Meter = field(init=False)
    file: str = ""
    file_bytes: int = 0
    file_total: int = 0
    files_done: int = 0

    def __post_init__(self):
        self.meter = Meter(self.plan.download_bytes)

    def status(self, kind: str = "downloading") -> DownloadStatus:
        pending = [f for f in self.plan.files if not f.cached]
        return DownloadStatus(str(self.plan.spec), kind, self.file, self.meter.done, self.meter.total,
                              self.file_bytes, self.file_total, self.files_done, len(pending),
                              round(self.meter.speed(), 1), self.meter.eta_s())

    def start_file(self, name: str, size: int) -> None:
        self.file, self.file_bytes, self.file_total = name, 0, size
        self.progress(self.status())

    def add(self, n: int) -> None:
        self.file_bytes += n
        self.meter.add(n, self.clock())
        self.progress(self.status())


def _fetch_file(spec: HubSpec, commit: str, name: str, settings: HubSettings, token: str | None,
                on_bytes: Callable[[int], None]) -> None:
    """One file's blob into the cache, resuming a partial file left by an earlier run."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers
    from huggingface_hub.utils._runtime import is_xet_available
    meta = get_hf_file_metadata(hf_hub_url(spec.repo_id, name, revision=commit, endpoint=settings.endpoint),
                                token=token)
    blob = storage_folder(settings, spec) / "blobs" / meta.etag
    if blob.exists():  # fetched by an earlier, interrupted run (its snapshot link comes at the end)
        on_bytes(blob.stat().st_size)
        return
    if meta.xet_file_data is not None and is_xet_available():  # Xet keeps its own chunk cache for resuming
        from huggingface_hub import hf_hub_download
        hf_hub_download(spec.repo_id, name, revision=commit, cache_dir=settings.cache_dir,
                        endpoint=settings.endpoint, token=token, tqdm_class=bar_class(on_bytes))
        return
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(blob.name + PARTIAL_SUFFIX)
    have = partial.stat().st_size if partial.exists() else 0
    if meta.size is not None and have > meta.size:  # not this file's prefix: start over
        partial.unlink()
        have = 0
    if have:
        on_bytes(have)  # resumed: the bar starts where the last run stopped
    with open(partial, "ab") as out:
        http_get(meta.location, out, resume_size=have, headers=build_hf_headers(token=token),
                 expected_size=meta.size, displayed_filename=name, tqdm_class=bar_class(on_bytes))
    os.replace(partial, blob)


def download(plan: DownloadPlan, settings: HubSettings, token: str | None, progress: Progress, key: str) -> Path:
    """Every missing file of the plan, then huggingface_hub's own snapshot (links, refs, tree cache)."""
    from huggingface_hub import snapshot_download
    spec = plan.spec
    transfer = Transfer(plan, progress)
    current = ""
    try:
        for f in plan.files:
            if f.cached:
                continue
            current = f.name
            transfer.start_file(f.name, f.size)
            _fetch_file(spec, plan.commit, f.name, settings, token, transfer.add)
            transfer.files_done += 1
        current = ""
        folder = snapshot_download(spec.repo_id, revision=spec.revision, cache_dir=settings.cache_dir,
                                   endpoint=settings.endpoint, token=token, tqdm_class=SilentBar,
                                   allow_patterns=[_literal(f.name) for f in plan.files])
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(describe(e, spec, key, settings.endpoint, current)) from e
    progress(transfer.status("done"))
    return Path(folder)


def _literal(name: str) -> str:
    """A file name as an fnmatch pattern that matches only itself."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def lock_path(settings: HubSettings, spec: HubSpec) -> Path:
    from huggingface_hub.file_download import repo_folder_name
    return settings.cache_dir / ".locks" / repo_folder_name(repo_id=spec.repo_id, repo_type="model") / "sd-studio.lock"


def fetch(spec: HubSpec, select: Selector, selection: str, *, key: str, token: str | None, progress: Progress,
          settings: HubSettings) -> Path:
    """The snapshot folder holding what `select` picks: from an earlier download without network, else
    downloaded under the repo's lock (a second process waits, then finds it done)."""
    from filelock import FileLock, Timeout
    found = cached_snapshot(settings, spec, selection)
    if found is not None:
        return found
    if settings.offline:
        raise ConfigError(offline_message(spec, key))
    path = lock_path(settings, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress(DownloadStatus(str(spec), "waiting"))
        lock.acquire()
    try:
        found = cached_snapshot(settings, spec, selection)
        if found is not None:
            return found
        try:
            plan = make_plan(spec, settings, token, select, key)
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(describe(e, spec, key, settings.endpoint)) from e
        check_space(plan, key)
        pending = [f for f in plan.files if not f.cached]
        progress(DownloadStatus(str(spec), "planned", total=plan.download_bytes, files_total=len(pending),
                                free_bytes=plan.free_bytes, cached_bytes=plan.cached_bytes))
        folder = download(plan, settings, token, progress, key)
        _write_record(settings, spec, selection, plan)
        return folder
    finally:
        lock.release()
