"""API tokens: random, shown once, kept only as their SHA-256 in the queue file, each with a scope
(`read`: look; `write`: also submit, stop, delete). A token is 256 random bits, so a plain hash
is as strong as a slow one would be (there is no password to guess)."""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
import time

from trainer_backend.errors import ConfigError

from .store import QueueStore

SCOPES = ("read", "write")
PREFIX = "sdq_"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token(store: QueueStore, name: str, scope: str = "write") -> str:
    """Create a token called `name`; returns it (the only time it is seen)."""
    if scope not in SCOPES:
        raise ConfigError(f"--scope: must be one of {', '.join(SCOPES)}, got {scope!r}")
    if not re.fullmatch(r"[\w.@-]{1,64}", name):
        raise ConfigError(f"--new-token: {name!r} is not a token name (letters, digits, . _ - @; at most 64)")
    token = PREFIX + secrets.token_urlsafe(32)
    try:
        with store.transaction() as db:
            db.execute("INSERT INTO tokens (name, scope, sha256, created) VALUES (?,?,?,?)",
                       (name, scope, _digest(token), time.time()))
    except sqlite3.IntegrityError:
        raise ConfigError(f"--new-token: a token named {name!r} exists; revoke it first or choose another name") from None
    return token


def check_token(store: QueueStore, token: str) -> tuple[str, str] | None:
    """(name, scope) of a valid token, else None."""
    if not token:
        return None
    digest = _digest(token)
    with store.lock:
        row = store.db.execute("SELECT name, scope, sha256 FROM tokens WHERE sha256 = ?", (digest,)).fetchone()
    if row is None or not hmac.compare_digest(row["sha256"], digest):
        return None
    return row["name"], row["scope"]


def list_tokens(store: QueueStore) -> list[dict]:
    with store.lock:
        return [dict(r) for r in store.db.execute("SELECT name, scope, created FROM tokens ORDER BY created")]


def revoke_token(store: QueueStore, name: str) -> bool:
    with store.transaction() as db:
        return db.execute("DELETE FROM tokens WHERE name = ?", (name,)).rowcount > 0
