"""The API's calls over urllib: one method per route, errors as ApiError with the server's words."""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_URL = "http://127.0.0.1:7860"


class ApiError(Exception):
    def __init__(self, status: int, detail):
        self.status, self.detail = status, detail
        if isinstance(detail, list):
            text = "\n".join(f"{d.get('key', '?')}: {d.get('message', d)}" if isinstance(d, dict) else str(d)
                             for d in detail)
        else:
            text = str(detail)
        super().__init__(text)


class ApiClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.url = (url or os.environ.get("SD_STUDIO_URL") or DEFAULT_URL).rstrip("/") + "/api/v1"
        self.token = token or os.environ.get("SD_STUDIO_TOKEN", "")
        self.timeout = timeout

    def request(self, method: str, path: str, body=None, raw: bool = False):
        req = urllib.request.Request(self.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                data = r.read()
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("detail")
            except (ValueError, AttributeError):
                detail = e.reason
            raise ApiError(e.code, detail) from None
        except urllib.error.URLError as e:
            raise ApiError(0, f"cannot reach {self.url}: {e.reason}") from None
        return data if raw else json.loads(data)

    def submit(self, config_toml: str, priority: int = 0, front: bool = False) -> dict:
        return self.request("POST", "/jobs", {"config_toml": config_toml, "priority": priority, "front": front})

    def jobs(self) -> dict:
        return self.request("GET", "/jobs")

    def job(self, job_id: int) -> dict:
        return self.request("GET", f"/jobs/{int(job_id)}")

    def stop(self, job_id: int) -> dict:
        return self.request("POST", f"/jobs/{int(job_id)}/stop", {})

    def log(self, job_id: int, after: int = 0) -> dict:
        return self.request("GET", f"/jobs/{int(job_id)}/log?after={int(after)}")

    def files(self, job_id: int) -> list[dict]:
        return self.request("GET", f"/jobs/{int(job_id)}/files")["files"]

    def file(self, job_id: int, name: str) -> bytes:
        return self.request("GET", f"/jobs/{int(job_id)}/files/{urllib.parse.quote(name)}", raw=True)
