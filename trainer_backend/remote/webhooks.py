"""Webhooks: an events sink that POSTs start, checkpoint, sample, epoch, done, error and
preempted/stopped notifications to each [[webhooks.targets]] URL, as JSON or as a Discord
message (sample images attached).

Each target has its own background thread and queue, so a slow or dead URL delays nothing
else; requests time out after `webhooks.timeout_s` and are retried `webhooks.retries` times
with backoff. A target's first failure is logged (by host only: URLs may carry tokens), later
ones are counted and summarised when the run closes. Closing waits at most about
timeout_s × (retries + 1) for the last notifications (e.g. `done`).
"""
from __future__ import annotations

import json
import logging
import mimetypes
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..config import TrainConfig
from ..run.contract import NOTIFIED, TERMINAL, Event
from .secrets import Secrets

LOG = logging.getLogger("trainer")
EVENT_MAP = {e.value: e.value for e in NOTIFIED}  # run/contract.py: the kinds a webhook may send
STATUS_FIELDS = ("step", "total_steps", "epoch", "loss", "lr", "eta_s")
DISCORD_MAX_FILES = 4
USER_AGENT = "sd-studio-webhooks/1"


@dataclass
class Target:
    url: str
    format: str
    headers: dict[str, str]
    events: set[str]
    label: str                                  # scheme://host, safe to log
    failures: int = 0
    queue: "queue.Queue[dict | None]" = field(default_factory=queue.Queue)


def safe_label(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}{':' + str(parts.port) if parts.port else ''}"


def resolve_targets(cfg: TrainConfig, secrets: Secrets) -> list[Target]:
    """Targets with their URL and auth header resolved from the secrets (ConfigError names the key)."""
    from ..config import ConfigError
    targets = []
    from ..config import rules
    rules.check(cfg, "webhooks")  # url or url_secret, exactly one (config/rules.py)
    for i, t in enumerate(cfg.webhooks.targets):
        key = f"webhooks.targets[{i}]"
        url = t.url or secrets.require(t.url_secret, f"{key}.url_secret")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{key}.url_secret: the secret {t.url_secret!r} is not an http(s) URL")
        headers = {t.auth_header: secrets.require(t.auth_secret, f"{key}.auth_secret")} if t.auth_secret else {}
        targets.append(Target(url=url, format=t.format, headers=headers, events=set(t.events), label=safe_label(url)))
    return targets


def build_payload(event: str, record: dict, status: dict, run_name: str, run_id: str, started: float) -> dict:
    """The JSON payload: run, event, progress fields, timestamp, plus the event's own fields."""
    payload = {"run": run_name, "run_id": run_id, "event": event,
               **{k: status.get(k) for k in STATUS_FIELDS},
               "elapsed_s": round(time.time() - started, 1),
               "timestamp": datetime.fromtimestamp(record.get("time", time.time()), timezone.utc).isoformat()}
    for k, v in record.items():
        if k not in ("event", "time") and (k not in payload or payload[k] is None):
            payload[k] = v
    return payload


def _fmt_duration(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def discord_message(payload: dict) -> dict:
    """A Discord webhook body: one line of text plus an embed with the details."""
    step, total = payload.get("step"), payload.get("total_steps")
    progress = f"step {step}/{total}" if step is not None and total else (f"step {step}" if step is not None else "")
    title = f"{payload['run']}: {payload['event']}" + (f" at {progress}" if progress else "")
    fields = []
    for name, key in (("epoch", "epoch"), ("loss", "loss"), ("lr", "lr")):
        value = payload.get(key)
        if value is not None:
            fields.append({"name": name, "value": f"{value:.4g}" if isinstance(value, float) else str(value),
                           "inline": True})
    if payload.get("eta_s") is not None and payload["event"] not in TERMINAL:
        fields.append({"name": "ETA", "value": _fmt_duration(payload["eta_s"]), "inline": True})
    fields.append({"name": "elapsed", "value": _fmt_duration(payload.get("elapsed_s")), "inline": True})
    for key in ("remote", "path", "message"):
        if payload.get(key):
            fields.append({"name": key, "value": str(payload[key])[:1000], "inline": False})
    return {"username": "SD Studio", "content": title[:2000],
            "embeds": [{"title": title[:256], "fields": fields[:25], "timestamp": payload["timestamp"]}]}


def encode_request(target: Target, payload: dict) -> tuple[bytes, dict[str, str]]:
    """(body, headers) for a target: JSON, or Discord (multipart with images for samples)."""
    headers = {"User-Agent": USER_AGENT, **target.headers}
    if target.format != "discord":
        return json.dumps(payload).encode(), {**headers, "Content-Type": "application/json"}
    message = discord_message(payload)
    images = [Path(p) for p in (payload.get("paths") or []) if Path(p).is_file()][:DISCORD_MAX_FILES]
    if not images:
        return json.dumps(message).encode(), {**headers, "Content-Type": "application/json"}
    boundary = uuid.uuid4().hex
    parts = [(f'--{boundary}\r\nContent-Disposition: form-data; name="payload_json"\r\n'
              f'Content-Type: application/json\r\n\r\n').encode() + json.dumps(message).encode() + b"\r\n"]
    for i, image in enumerate(images):
        ctype = mimetypes.guess_type(image.name)[0] or "application/octet-stream"
        parts.append((f'--{boundary}\r\nContent-Disposition: form-data; name="files[{i}]"; '
                      f'filename="{image.name}"\r\nContent-Type: {ctype}\r\n\r\n').encode()
                     + image.read_bytes() + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), {**headers, "Content-Type": f"multipart/form-data; boundary={boundary}"}


class WebhookSink:
    def __init__(self, cfg: TrainConfig, targets: list[Target], run_name: str, started: float):
        self.cfg, self.targets, self.run_name, self.started = cfg, targets, run_name, started
        self.run_id = ""
        self.status: dict = {}
        self.deadline: float | None = None
        self.threads = [threading.Thread(target=self._work, args=(t,), name=f"webhook-{i}", daemon=True)
                        for i, t in enumerate(targets)]
        for thread in self.threads:
            thread.start()

    def handle(self, record: dict) -> None:
        kind = record.get("event")
        if kind == Event.PLAN:
            self.status["total_steps"] = record.get("total_steps", self.status.get("total_steps"))
        if kind == Event.START:
            self.run_id = record.get("run_id") or self.run_id
        for k in STATUS_FIELDS:
            if record.get(k) is not None and kind in (Event.STEP, Event.START, Event.EPOCH, Event.CHECKPOINT, Event.RESUMED):
                self.status[k] = record[k]
        event = EVENT_MAP.get(kind)
        if event is None:
            return
        payload = build_payload(event, record, self.status, self.run_name, self.run_id, self.started)
        for target in self.targets:
            if event in target.events:
                target.queue.put(payload)

    def close(self) -> None:
        w = self.cfg.webhooks
        self.deadline = time.monotonic() + w.timeout_s * (w.retries + 1) + 2.0 * w.retries + 1.0
        for target in self.targets:
            target.queue.put(None)
        for thread in self.threads:
            thread.join(timeout=max(0.0, self.deadline - time.monotonic()))
        for target in self.targets:
            left = target.queue.qsize()
            if target.failures or left:
                LOG.warning("webhook %s: %d notification(s) failed, %d not sent before the run ended", target.label,
                            target.failures, max(0, left - 1))

    def _work(self, target: Target) -> None:
        while True:
            payload = target.queue.get()
            if payload is None:
                return
            if self.deadline is not None and time.monotonic() >= self.deadline:
                target.failures += 1
                continue
            if not self._deliver(target, payload):
                target.failures += 1
                if target.failures == 1:
                    LOG.warning("webhook %s: %s notification failed; further failures are only counted",
                                target.label, payload["event"])

    def _deliver(self, target: Target, payload: dict) -> bool:
        w = self.cfg.webhooks
        try:
            body, headers = encode_request(target, payload)
        except OSError:
            return False
        for attempt in range(w.retries + 1):
            try:
                request = urllib.request.Request(target.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=w.timeout_s) as response:
                    response.read()
                return True
            except urllib.error.HTTPError as e:
                if 400 <= e.code < 500 and e.code != 429:
                    return False  # the request itself is wrong: retrying will not help
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if attempt < w.retries:
                delay = 2.0 ** attempt
                if self.deadline is not None:
                    delay = min(delay, max(0.0, self.deadline - time.monotonic()))
                time.sleep(delay)
        return False
