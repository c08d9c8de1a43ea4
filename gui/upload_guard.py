"""Writes come only from the studio's own page, and uploads are size-capped.

A browser sends any web page's form or fetch POST to a loopback studio, with the user's cookies;
what it cannot forge is the `Origin` header (and `Referer`). So a POST, PUT, PATCH or DELETE
whose Origin (else Referer) names another site than the one the request was sent to (its Host,
or X-Forwarded-Host behind a proxy) is refused with 403 before gradio sees it: a page the user
visits can no longer store files through /gradio_api/upload, nor start a run. Requests with
neither header (gradio_client, curl, scripts) are not a browser's cross-site request and pass.
/api/v1/ (the queue's API) is left to its own tokens. An upload whose declared size is over the
limit is refused with 413 and none of it is stored (gradio's max_file_size checks the rest); up to 64 MiB
it is read and dropped first, so the client reads the 413 instead of a connection reset mid-upload.
"""
from __future__ import annotations

from urllib.parse import urlsplit

UPLOAD_PATH = "/gradio_api/upload"
API_PREFIX = "/api/v1/"
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
DEFAULT_UPLOAD_MB = 512
DRAIN_BYTES = 64 * 1024 * 1024  # an over-limit upload up to this size is read (and dropped) before its 413


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _site(url: str) -> str | None:
    """'host:port' (the scheme's default port filled in) of an Origin/Referer value; None if unusable."""
    try:
        parts = urlsplit(url)
        if not parts.hostname:
            return None
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None
    return f"{parts.hostname.lower()}:{port}"


def _host_site(host: str, scheme: str) -> str | None:
    return _site(f"{scheme}://{host.strip()}") if host.strip() else None


def cross_site(scope) -> bool:
    """Whether a request carries an Origin (or, without one, a Referer) naming another site than the
    one it was addressed to."""
    headers = _headers(scope)
    claimed = headers.get("origin") or headers.get("referer")
    if not claimed:
        return False
    if claimed == "null":   # sandboxed frames and file:// pages: never the studio's own page
        return True
    scheme = scope.get("scheme", "http")
    targets = {_host_site(headers.get("host", ""), scheme)}
    forwarded = headers.get("x-forwarded-host", "").split(",")[0]
    if forwarded:
        targets.add(_host_site(forwarded, headers.get("x-forwarded-proto", scheme).split(",")[0].strip()))
    return _site(claimed) not in targets - {None}


class SameOriginWrites:
    """Pure ASGI middleware in front of gradio (gui/cli.py)."""

    def __init__(self, app, max_upload_mb: int = DEFAULT_UPLOAD_MB):
        self.app = app
        self.max_bytes = max_upload_mb * 1024 * 1024

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method", "GET") not in WRITE_METHODS:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = (scope.get("root_path") or "").rstrip("/")
        if root and path.startswith(root):
            path = path[len(root):]
        if not path.startswith(API_PREFIX) and cross_site(scope):
            await _answer(send, 403, b'{"detail": "cross-site request refused: writes come only from the '
                                     b'studio\'s own page"}')
            return
        if path.rstrip("/") == UPLOAD_PATH:
            length = _headers(scope).get("content-length", "")
            if length.isdigit() and int(length) > self.max_bytes:
                if int(length) <= DRAIN_BYTES:  # read and drop it first: a client still sending meets no reset
                    await _drain(receive)       # connection and reads the 413 (larger ones are cut off at once)
                await _answer(send, 413, f'{{"detail": "upload over {self.max_bytes // (1024 * 1024)} MB '
                                         f'(python app.py --max-upload-mb)"}}'.encode())
                return
        await self.app(scope, receive, send)


async def _drain(receive) -> None:
    """Read and drop the request body (at most DRAIN_BYTES were declared): nothing of it is kept."""
    while True:
        message = await receive()
        if message.get("type") != "http.request" or not message.get("more_body"):
            return


async def _answer(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
