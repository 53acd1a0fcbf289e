"""Semaphore names: built from a task's arguments, then turned into Redis keys.

Two steps, kept apart:

* :class:`KeyTemplate` turns a task's call arguments into a *name*, such as
  ``"customer:42"``. Arguments are bound by name with defaults applied, so ``f(42)`` and
  ``f(customer_id=42)`` give the same name.
* :func:`semaphore_key` and :func:`rate_key` turn a name into a Redis key. Keys carry a
  hash tag made from a digest of the name, so the semaphore and the rate limiter of one
  name share a Redis Cluster hash slot whatever characters the arguments contain, and a
  name of any length gives a key of bounded length.
"""

from __future__ import annotations

import hashlib
import inspect
import string
from typing import Any, Callable, Mapping, Sequence, Union

from ..errors import LockConfigurationError, LockKeyError

KeySource = Union[str, Callable[..., Any], None]

#: How much of a name is kept, readable, at the end of its Redis keys.
READABLE_NAME_LENGTH = 100

DEFAULT_PREFIX = "redislock:"


class KeyTemplate:
    """Builds a semaphore name from the arguments of one call of a task.

    ``source`` is ``None`` (the name is ``default``, normally the task's name), a
    :meth:`str.format` template over the function's argument names, or a callable that
    takes the task's arguments and returns the name. Everything is checked here, once,
    so a mistake surfaces when the task is defined::

        >>> def sync_customer(customer_id, full=False): ...
        >>> key = KeyTemplate("customer:{customer_id}", sync_customer, owner="sync")
        >>> key.render((42,), {}) == key.render((), {"customer_id": 42})
        True
        >>> key.render((42,), {})
        'customer:42'
    """

    def __init__(
        self,
        source: KeySource,
        func: Callable[..., Any],
        *,
        owner: str,
        default: str | None = None,
    ) -> None:
        self.source = source
        self.owner = owner
        self._default = default if default is not None else owner
        self._signature: inspect.Signature | None = None
        if source is None:
            return
        if callable(source):
            return
        if not isinstance(source, str):
            raise LockConfigurationError(
                f"{owner}: lock_key must be a template string or a callable, "
                f"not {type(source).__name__}"
            )
        if not source:
            raise LockConfigurationError(f"{owner}: lock_key must not be empty")
        self._signature = _signature_of(func, owner)
        self._check_fields(source, self._signature)

    @property
    def is_constant(self) -> bool:
        """True when every call gets the same name (no template, no callable)."""
        return self.source is None

    def render(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The semaphore name for one call; raises :class:`LockKeyError` if it cannot be built."""
        if self.source is None:
            return self._default
        try:
            if callable(self.source):
                name = self.source(*args, **kwargs)
            else:
                name = self.source.format_map(self._arguments(args, kwargs))
        except LockKeyError:
            raise
        except Exception as exc:
            raise LockKeyError(
                f"{self.owner}: could not build the lock key from {self.source!r} "
                f"for args={tuple(args)!r} kwargs={dict(kwargs)!r}: {exc}"
            ) from exc
        name = str(name)
        if not name:
            raise LockKeyError(f"{self.owner}: lock key {self.source!r} gave an empty name")
        return name

    def _arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        assert self._signature is not None
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        for name, parameter in self._signature.parameters.items():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                values.update(values.pop(name, {}))
        return values

    def _check_fields(self, template: str, signature: inspect.Signature) -> None:
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise LockConfigurationError(
                f"{self.owner}: lock_key {template!r} is not a valid template: {exc}"
            ) from exc
        parameters = signature.parameters
        takes_any_keyword = any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
        )
        accepted = [
            name for name, p in parameters.items()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
        for _, field, _, conversion in parsed:
            if field is None:
                continue
            if conversion not in (None, "r", "s", "a"):
                raise LockConfigurationError(
                    f"{self.owner}: lock_key {template!r} has an unknown conversion "
                    f"!{conversion} (use !r, !s or !a)"
                )
            root = _field_root(field)
            if not root or root.isdigit():
                example = accepted[0] if accepted else "argument_name"
                raise LockConfigurationError(
                    f"{self.owner}: lock_key {template!r} uses a positional field "
                    f"{{{field}}}; name the argument instead, e.g. {{{example}}}"
                )
            if root not in accepted and not takes_any_keyword:
                raise LockConfigurationError(
                    f"{self.owner}: lock_key {template!r} names argument {root!r}, which the "
                    f"task does not take (it takes: {', '.join(accepted) or 'no arguments'})"
                )


def _field_root(field: str) -> str:
    for index, char in enumerate(field):
        if char in ".[":
            return field[:index]
    return field


def _signature_of(func: Callable[..., Any], owner: str) -> inspect.Signature:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise LockConfigurationError(
            f"{owner}: cannot read the task's arguments to check lock_key: {exc}"
        ) from exc


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


#: What every semaphore key holds after its hash tag.
SEMAPHORE_MARK = "}:s:"

#: The marks of the keys of one limit name (``<prefix>{<digest>}:<mark>:<name>``): the
#: semaphore, its waiting line, its waiters' records and messages, when its tickets are
#: forgotten, its operators' controls; the rate limiter and its operators' controls.
SEMAPHORE, LINE, WAITERS, TICKETS, SEMAPHORE_CONTROL, RATE, RATE_CONTROL = (
    "s", "q", "w", "x", "cs", "r", "cr")


def companion_key(key: str, mark: str) -> str:
    """The key with ``mark`` of the same name as ``key`` (same hash tag, so same Cluster
    slot): the mark after the hash tag is replaced. ``lua/line.lua`` does the same.

        >>> companion_key("redislock:{85280b862f4ca735}:s:customer:42", "q")
        'redislock:{85280b862f4ca735}:q:customer:42'
        >>> companion_key("redislock:{85280b862f4ca735}:r:customer:42", "cr")
        'redislock:{85280b862f4ca735}:cr:customer:42'
    """
    close = key.index("}:")
    end = key.index(":", close + 2)
    return f"{key[:close]}}}:{mark}{key[end:]}"
