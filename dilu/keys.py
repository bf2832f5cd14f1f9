"""API keys: their format, hashing and what each scope allows (pure; storage is in ``dilu.db``).

A key reads ``dilu_<id>_<secret>``: the id finds the stored row, the secret is checked against
its SHA-256 (keys are 256-bit random, so a slow password hash would add nothing but latency on
every request). Scopes:

- ``admin``: everything (deploy, delete, scale, logs, keys, and all below);
- ``read``: list, describe, status, instances, events;
- ``invoke``: invoke every function; ``invoke:<name>``: invoke that function only (and read the
  metadata and readiness of the models it may invoke, over the inference protocol).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from enum import StrEnum

KEY_PATTERN = re.compile(r"dilu_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
SCOPE_PATTERN = re.compile(r"admin|read|invoke(:[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?)?")


class Need(StrEnum):
    """What a route asks of the caller's key."""

    ADMIN = "admin"
    READ = "read"
    INVOKE = "invoke"
    MODEL = "model"     # a model's metadata and readiness (v2): read, or invoke on that function


def new_key() -> tuple[str, str, str]:
    """(id, secret hash, the full key to hand out once)."""
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return key_id, hash_secret(secret), f"dilu_{key_id}_{secret}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse(key: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed key, else None."""
    match = KEY_PATTERN.fullmatch(key.strip())
    return (match.group(1), match.group(2)) if match else None


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)


def check_scopes(scopes: Iterable[str]) -> list[str]:
    """The scopes, sorted and unique; ValueError naming the first unknown one."""
    found = sorted(set(scopes))
    if not found:
        raise ValueError("a key needs at least one scope: admin, read, invoke or invoke:<function>")
    for scope in found:
        if not SCOPE_PATTERN.fullmatch(scope):
            raise ValueError(f"unknown scope {scope!r}: use admin, read, invoke or invoke:<function>")
    return found


def allows(scopes: Iterable[str], need: Need, function: str | None = None) -> bool:
    """Whether a key with ``scopes`` may do what ``need`` names (on ``function`` for invokes)."""
    held = set(scopes)
    if "admin" in held:
        return True
    if need == Need.READ:
        return "read" in held
    if need == Need.INVOKE:
        return "invoke" in held or (function is not None and f"invoke:{function}" in held)
    if need == Need.MODEL:
        return "read" in held or allows(held, Need.INVOKE, function)
    return False
