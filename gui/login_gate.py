"""With --auth, a stranger gets the login form and nothing else.

Gradio's own login page is the whole app's HTML with the API description embedded (every
endpoint with the opening preset's values: absolute paths on this machine), and a few other
routes answer without a session. This ASGI middleware sits in front of gradio: until the
request carries a session gradio issued at /login, GET / answers a small login form, POST
/login (and launch's own start-up ping) go through to gradio, and everything else is 401.
"""
from __future__ import annotations

import html

STARTUP_PING = "/gradio_api/startup-events"   # gradio's launch() checks it answers (no content)
API_PREFIX = "/api/v1/"   # the queue's API: every route there asks for its own token (trainer_backend/jobqueue/api.py)

LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{title}: log in</title>
<style>body{{font-family:system-ui,sans-serif;display:flex;justify-content:center;margin-top:12vh}}
form{{display:flex;flex-direction:column;gap:10px;width:260px}}#msg{{color:#c0392b;min-height:1.2em}}</style>
</head><body><form id="login"><h2>{title}</h2>
<input name="username" placeholder="user name" autocomplete="username" required>
<input name="password" type="password" placeholder="password" autocomplete="current-password" required>
<button type="submit">Log in</button><div id="msg"></div></form>
<script>
document.getElementById("login").addEventListener("submit", async (e) => {{
  e.preventDefault();
  const r = await fetch("login", {{method: "POST", body: new URLSearchParams(new FormData(e.target)),
                                  credentials: "same-origin"}});
  if (r.ok) location.reload(); else document.getElementById("msg").textContent = "Incorrect user name or password.";
}});
</script></body></html>
"""


def _logged_in(scope, app) -> bool:
    from starlette.requests import HTTPConnection
    cookies = HTTPConnection(scope).cookies
    cookie_id = getattr(app, "cookie_id", "")
    token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
    return bool(token) and token in getattr(app, "tokens", {})


class LoginOnlyForStrangers:
    """Starlette middleware (pure ASGI). Inactive when the app has no auth."""

    def __init__(self, app, title: str = "SD Training Studio"):
        self.app = app
        self.page = LOGIN_PAGE.format(title=html.escape(title)).encode()

    async def __call__(self, scope, receive, send):
        gradio_app = scope.get("app")
        if (scope["type"] not in ("http", "websocket") or getattr(gradio_app, "auth", None) is None
                or _logged_in(scope, gradio_app)):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = (scope.get("root_path") or "").rstrip("/")
        if root and path.startswith(root):
            path = path[len(root):]
        method = scope.get("method", "GET")
        if (method == "POST" and path.rstrip("/") == "/login") or path == STARTUP_PING or path.startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and method in ("GET", "HEAD") and path in ("", "/"):
            await _answer(send, 200, self.page, b"text/html; charset=utf-8")
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _answer(send, 401, b'{"detail": "log in first"}', b"application/json")


async def _answer(send, status: int, body: bytes, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
