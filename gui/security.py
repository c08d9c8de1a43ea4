"""Who may reach the studio: bind-address policy and --auth parsing.

The studio can start training jobs that run arbitrary paths on this machine, so it
listens on loopback by default. Anything else (a LAN address, 0.0.0.0, a public
--share link) needs credentials, or the loudly named opt-out flag.
"""
from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

OPT_OUT_FLAG = "--dangerously-allow-unauthenticated"
LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


class SecurityError(SystemExit):
    """Refusal to start; SystemExit so `python app.py` prints one line and exits 2."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; False for 0.0.0.0, LAN and public names."""
    host = host.strip().strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name we cannot vouch for


def parse_auth(value: str) -> list[tuple[str, str]]:
    """`user:pass`, several separated by commas, or a path to a file of `user:pass` lines."""
    value = value.strip()
    if not value:
        raise SecurityError("--auth: empty; expected user:password or a file of user:password lines")
    path = Path(value).expanduser()
    if path.is_file():
        mode = path.stat().st_mode
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            print(f"warning: --auth file {path} is readable by other users; chmod 600 it")
        entries = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
        entries = [e for e in entries if e and not e.startswith("#")]
        source = str(path)
    else:
        if os.sep in value and ":" not in value:
            raise SecurityError(f"--auth: file {value} not found")
        entries = [e.strip() for e in value.split(",") if e.strip()]
        source = "--auth"
    pairs = []
    for entry in entries:
        user, sep, password = entry.partition(":")
        if not sep or not user or not password:
            raise SecurityError(f"{source}: expected user:password, got an entry without both parts")
        pairs.append((user, password))
    if not pairs:
        raise SecurityError(f"{source}: no user:password entries")
    return pairs


def check_exposure(host: str, share: bool, auth: list[tuple[str, str]] | None, allow_unauthenticated: bool) -> str:
    """Raise SecurityError when the studio would be reachable by others without a password.

    Returns a warning line (possibly empty) to print when the opt-out is used."""
    exposed = share or not is_loopback(host)
    if not exposed or auth:
        return ""
    where = "a public --share link" if share else f"host {host!r} (reachable from other machines)"
    if not allow_unauthenticated:
        raise SecurityError(
            f"refusing to serve on {where} without --auth user:password. Anyone who can reach it could start "
            f"jobs and read files on this machine. Add --auth, or pass {OPT_OUT_FLAG} if you really mean it.")
    return f"WARNING: serving on {where} WITHOUT authentication ({OPT_OUT_FLAG})."


def allowed_hosts(host: str, share: bool) -> list[str]:
    """Host headers the studio answers (a guard against DNS rebinding: a web page the user visits
    must not reach a loopback studio through a name it rebinds to 127.0.0.1). Loopback names and
    the bound host; any host when the studio listens on all interfaces or is shared (both need
    --auth, which is then the guard)."""
    bound = host.strip().strip("[]")
    if share or bound in ("0.0.0.0", "::"):
        return ["*"]
    names = ["localhost", "127.0.0.1", "::1", "[::1]"]
    if bound not in names:
        names.append(f"[{bound}]" if ":" in bound else bound)
    return names

