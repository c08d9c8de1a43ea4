"""A loopback HTTP server that speaks the part of the Hugging Face hub protocol huggingface_hub's
`snapshot_download` / `hf_hub_download` use, for tests (FIELD-NOTES.md 2026-11-28):

- `GET /api/models/{repo}/revision/{rev}`   repo info: `sha` and `siblings`;
- `GET /api/models/{repo}/tree/{rev}`       the file listing (`recursive` is always on);
- `HEAD|GET /{repo}/resolve/{rev}/{file}`   the file with `X-Repo-Commit`, `ETag`, `Content-Length`,
                                           and `Range` requests answered with 206 (resume);
- errors as the hub sends them: 401/403 with `X-Error-Code: GatedRepo`, 404 with `RepoNotFound`,
  `RevisionNotFound` or `EntryNotFound`.

Point a client at it with `HF_ENDPOINT=server.url` (and a temporary `HF_HOME`). Faults for the tests of
interrupted downloads are knobs on the server: `throttle` (bytes per second for the bodies of matching
files), `stall_after` (send that many bytes of a file, then nothing until the server stops) and
`truncate` (HEAD announces the real size, GET serves only the first bytes as if they were the whole file). Every request is recorded in `requests`.

Usage:
    with HubServer() as hub:
        hub.add_folder("org/tiny", tiny_model_dir)
        hub.add_files("org/gated", {"model_index.json": b"{}"}, token="hf_secret")
        hub.faults.stall_after["unet/diffusion_pytorch_model.safetensors"] = 100_000
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf")}
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHUNK = 16 * 1024
LFS_FROM = 10_000   # files this big are served as LFS files (tree entries with `lfs`, ETag = sha256)


@dataclass
class HubRepo:
    files: dict[str, bytes]
    token: str | None = None           # gated: only `Authorization: Bearer <token>` gets in
    sha: str = ""

    def __post_init__(self):
        if not self.sha:
            digest = hashlib.sha1()
            for name in sorted(self.files):
                digest.update(name.encode() + b"\0" + hashlib.sha1(self.files[name]).digest())
            self.sha = digest.hexdigest()


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorized: bool


@dataclass
class Faults:
    throttle: dict[str, int] = field(default_factory=dict)      # file name suffix -> bytes per second
    stall_after: dict[str, int] = field(default_factory=dict)   # file name suffix -> bytes sent, then silence
    truncate: dict[str, int] = field(default_factory=dict)      # file name suffix -> bytes GET serves

    @staticmethod
    def find(table: dict[str, int], name: str) -> int | None:
        return next((value for suffix, value in table.items() if name.endswith(suffix)), None)


class HubServer:
    def __init__(self):
        self.repos: dict[str, HubRepo] = {}
        self.faults = Faults()
        self.requests: list[Request] = []
        self.stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add_files(self, repo_id: str, files: dict[str, bytes], token: str | None = None) -> HubRepo:
        self.repos[repo_id] = HubRepo(dict(files), token=token)
        return self.repos[repo_id]

    def add_folder(self, repo_id: str, folder: Path, token: str | None = None) -> HubRepo:
        folder = Path(folder)
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.add_files(repo_id, files, token=token)

    def file_requests(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + name)]

    def start(self) -> "HubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _etag(data: bytes) -> str:
    """The hub's ETag: an LFS file's sha256, a small (git) file's blob id."""
    return hashlib.sha256(data).hexdigest() if len(data) >= LFS_FROM else _git_oid(data)


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _tree_file(name: str, data: bytes) -> dict:
    entry = {"type": "file", "path": name, "size": len(data), "oid": _git_oid(data)}
    if len(data) >= LFS_FROM:
        entry.update(size=134, lfs={"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134})
    return entry


def _handler(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the tests read hub.requests
            pass

        def do_HEAD(self):
            self._answer(body=False)

        def do_GET(self):
            self._answer(body=True)

        # ---- routing
        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append(Request(self.command, path, self.headers.get("Range"), self._token() is not None))
            if path.startswith("/api/models/"):
                parts = path[len("/api/models/"):].split("/")
                if len(parts) >= 4 and parts[2] in ("revision", "tree"):
                    repo = self._repo("/".join(parts[:2]), parts[3])
                    if repo is not None:
                        listing = (self._info("/".join(parts[:2]), repo) if parts[2] == "revision"
                                   else self._tree(repo, "/".join(parts[4:])))
                        self._json(200, listing, body)
                    return
            parts = path.lstrip("/").split("/")
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = self._repo("/".join(parts[:2]), parts[3])
                if repo is not None:
                    self._file(repo, "/".join(parts[4:]), body)
                return
            self._error(404, "RepoNotFound", "not a hub route")

        def _token(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            return auth[len("Bearer "):] if auth.startswith("Bearer ") else None

        def _repo(self, repo_id: str, revision: str) -> HubRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
                return None
            if repo.token is not None and self._token() != repo.token:
                status = 401 if self._token() is None else 403
                self._error(status, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                                                 "to it and be authenticated to access it. Please log in.")
                return None
            if revision not in ("main", repo.sha):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return None
            return repo

        # ---- answers
        def _info(self, repo_id: str, repo: HubRepo) -> dict:
            return {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False,
                    "gated": "manual" if repo.token else False,
                    "siblings": [{"rfilename": name} for name in sorted(repo.files)]}

        def _tree(self, repo: HubRepo, under: str) -> list[dict]:
            names = sorted(n for n in repo.files if not under or n.startswith(under.rstrip("/") + "/"))
            folders = sorted({"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)})
            return ([{"type": "directory", "path": f, "oid": hashlib.sha1(f.encode()).hexdigest()} for f in folders]
                    + [_tree_file(n, repo.files[n]) for n in names])

        def _file(self, repo: HubRepo, name: str, body: bool) -> None:
            data = repo.files.get(name)
            if data is None:
                self._error(404, "EntryNotFound", f"{name} does not exist in the repo")
                return
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes=") and body:
                start = int(ranged[len("bytes="):].split("-")[0] or 0)
            cut = Faults.find(hub.faults.truncate, name)
            if body and cut is not None:
                data = data[:cut]
            status = 206 if start else 200
            self.send_response(status)
            self.send_header("X-Repo-Commit", repo.sha)
            self.send_header("ETag", '"' + _etag(data) + '"')
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if body:
                self._send_body(name, data, start)

        def _send_body(self, name: str, data: bytes, start: int) -> None:
            rate = Faults.find(hub.faults.throttle, name)
            stall = Faults.find(hub.faults.stall_after, name)
            end, position = len(data), start
            try:
                while position < end:
                    if stall is not None and position >= stall:
                        hub.stopping.wait()  # silence until the server stops
                        return
                    piece = data[position:min(end, position + CHUNK, stall if stall and stall > position else end)]
                    self.wfile.write(piece)
                    self.wfile.flush()
                    position += len(piece)
                    if rate:
                        time.sleep(len(piece) / rate)
            except (BrokenPipeError, ConnectionResetError):
                return

        def _json(self, status: int, payload, body: bool) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if body:
                self.wfile.write(raw)

        def _error(self, status: int, code: str, message: str) -> None:
            raw = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

    return Handler


def client_env(hub: HubServer, hf_home: Path, **extra: str) -> dict[str, str]:
    """Environment for a subprocess that must talk to `hub` only, with its own cache."""
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


def point_client_at(monkeypatch, hub: HubServer, hf_home: Path, download_timeout: float | None = None,
                    chunk_size: int | None = None) -> None:
    """This process's huggingface_hub pointed at `hub` with `hf_home` as HF_HOME: the environment for what
    reads it at call time, and huggingface_hub's constants (read at its import) for the rest, so nothing
    reaches huggingface.co. `download_timeout`: seconds without data before a read fails (a stall);
    `chunk_size`: huggingface_hub writes what it received in chunks of this size (10 MB by default, so a
    download of a tiny file that stops loses everything it had not written)."""
    from huggingface_hub import constants
    for name, value in client_env(hub, hf_home).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(Path(hf_home) / "hub"))
    if download_timeout is not None:
        monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", download_timeout)
    if chunk_size is not None:
        monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", chunk_size)
