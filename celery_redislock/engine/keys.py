"""Semaphore names: built from a task's arguments, then turned into Redis keys.

Two steps, kept apart:

* :class:`KeyTemplate` (:mod:`.key_template`) turns a task's call arguments into a
  *name*, such as ``"customer:42"``. Arguments are bound by name with defaults applied, so
  ``f(42)`` and ``f(customer_id=42)`` give the same name.
* :func:`semaphore_key` and :func:`rate_key` turn a name into a Redis key. Keys carry a
  hash tag made from a digest of the name, so the semaphore and the rate limiter of one
  name share a Redis Cluster hash slot whatever characters the arguments contain, and a
  name of any length gives a key of bounded length.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..errors import LockConfigurationError
from .key_template import KeySource, KeyTemplate

__all__ = ["KeySource", "KeyTemplate", "check_prefix", "companion_key", "name_digest",
           "rate_key", "semaphore_key"]

#: How much of a name is kept, readable, at the end of its Redis keys.
READABLE_NAME_LENGTH = 100

DEFAULT_PREFIX = "redislock:"


def check_prefix(prefix: Any) -> str:
    """Return ``prefix`` if it can start Redis keys, else raise :class:`LockConfigurationError`."""
    if not isinstance(prefix, str):
        raise LockConfigurationError(
            f"setting redislock_key_prefix must be a string, not {type(prefix).__name__}"
        )
    if "{" in prefix or "}" in prefix:
        raise LockConfigurationError(
            f"setting redislock_key_prefix {prefix!r} must not contain '{{' or '}}': "
            "the package adds its own Redis Cluster hash tag"
        )
    return prefix


def name_digest(name: str) -> str:
    """A short, stable digest of a semaphore name (64 bits of SHA-1, in hex)."""
    return hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _readable(name: str) -> str:
    return name if len(name) <= READABLE_NAME_LENGTH else name[:READABLE_NAME_LENGTH] + "~"


def rate_key(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The Redis key of the rate limiter ``name``: ``{prefix}{<digest>}:r:<name>``.

    It shares its hash slot with the semaphore of the same name.

        >>> rate_key("customer:42")
        'redislock:{85280b862f4ca735}:r:customer:42'
    """
    return f"{prefix}{{{name_digest(name)}}}:r:{_readable(name)}"


def semaphore_key(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The Redis key of the semaphore ``name``: ``{prefix}{<digest>}:s:<name>``.

    The name is cut to :data:`READABLE_NAME_LENGTH` characters (the digest keeps cut
    names distinct).

        >>> semaphore_key("customer:42")
        'redislock:{85280b862f4ca735}:s:customer:42'
    """
    return f"{prefix}{{{name_digest(name)}}}:s:{_readable(name)}"


def unique_key(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The Redis key of the unique lock of ``name`` (``lock_unique``):
    ``{prefix}{<digest>}:u:<name>``, in the hash slot of the name's semaphore.

        >>> unique_key("customer:42")
        'redislock:{85280b862f4ca735}:u:customer:42'
    """
    return f"{prefix}{{{name_digest(name)}}}:{UNIQUE}:{_readable(name)}"


def period_key(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The Redis key that marks a run of ``name`` within its period (``lock_period``):
    ``{prefix}{<digest>}:p:<name>``.

        >>> period_key("customer:42")
        'redislock:{85280b862f4ca735}:p:customer:42'
    """
    return f"{prefix}{{{name_digest(name)}}}:{PERIOD}:{_readable(name)}"


#: What every semaphore key holds after its hash tag.
SEMAPHORE_MARK = "}:s:"

#: The marks of the keys of one limit name (``<prefix>{<digest>}:<mark>:<name>``): the
#: semaphore, its operators' controls; the rate limiter and its operators' controls (its
#: parked line's are :mod:`.parked_view`'s).
SEMAPHORE, SEMAPHORE_CONTROL, RATE, RATE_CONTROL = ("s", "cs", "r", "cr")

#: The marks of a name's unique lock (owned by the queued or running task id) and of its
#: last run's period.
UNIQUE, PERIOD = "u", "p"


def companion_key(key: str, mark: str) -> str:
    """The key with ``mark`` of the same name as ``key`` (same hash tag, so same Cluster
    slot): the mark after the hash tag is replaced. ``lua/line.lua`` does the same.

        >>> companion_key("redislock:{85280b862f4ca735}:s:customer:42", "cs")
        'redislock:{85280b862f4ca735}:cs:customer:42'
        >>> companion_key("redislock:{85280b862f4ca735}:r:customer:42", "cr")
        'redislock:{85280b862f4ca735}:cr:customer:42'
    """
    close = key.index("}:")
    end = key.index(":", close + 2)
    return f"{key[:close]}}}:{mark}{key[end:]}"
