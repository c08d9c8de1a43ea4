"""network.block_lr keys: which denoiser blocks a key names (pure; the family names the blocks,
`Family.block_of`). A key is a block name ("IN04"), a glob ("OUT*", "single_?3") or a numbered
range ("OUT03-05", "single_10-37": the prefix, then the first and last number, inclusive)."""
from __future__ import annotations

import fnmatch
import re

_RANGE = re.compile(r"^(?P<prefix>[A-Za-z_.]*?)(?P<first>\d+)-(?P<last>\d+)$")
_NUMBERED = re.compile(r"^(?P<prefix>[A-Za-z_.]*?)(?P<number>\d+)$")


def pattern_problem(key: str) -> str:
    """Why a block_lr key cannot name blocks ("" when it can)."""
    if not key.strip():
        return "an empty key names no block"
    found = _RANGE.match(key)
    if found and int(found["first"]) > int(found["last"]):
        return f"the range {key!r} runs backwards (write {found['prefix']}{found['last']}-{found['first']})"
    return ""


def matches(key: str, block: str) -> bool:
    """Does block_lr key `key` name block `block`?"""
    found = _RANGE.match(key)
    if found:
        numbered = _NUMBERED.match(block)
        return bool(numbered) and numbered["prefix"] == found["prefix"] and \
            int(found["first"]) <= int(numbered["number"]) <= int(found["last"])
    return fnmatch.fnmatchcase(block, key)


def multiplier(block: str | None, block_lr: dict[str, float]) -> float:
    """The LR multiplier of `block`: the last matching key's value, 1.0 when none matches (or the
    module belongs to no block)."""
    value = 1.0
    if block is None:
        return value
    for key, factor in block_lr.items():
        if matches(key, block):
            value = float(factor)
    return value
