"""A worker request's task context (Celery's ``Context``, ``request._context``) for the
gate, which reads it for every limited run in the worker's main process.

Celery makes it on first use, and finds the message's custom headers (the wait header
among them) by copying the request's fields and popping every name Celery knows from
the copy, a set of some 45 names built anew each time: 10-15 µs per run, where a
plain task never makes it in the main process. :func:`context_of` makes the same
object (the same attributes, kept as the request's own ``_context`` for Celery to use
later) with the custom headers found in one pass against those names, built once.
It does so only when a check at import shows that it makes exactly what this Celery
makes; else, or for a request it does not know, it is Celery's own.

Whether a request is revoked (:func:`revoked`) is read so too: Celery's
``Request.revoked()`` makes some six Python calls (its properties, the revoked ids'
``__contains__``) to find, for nearly every run, that nothing revoked it; the same
fields read directly answer that, and anything else is Celery's own answer.

    >>> class Request:
    ...     _context = "celery's own"
    >>> context_of(Request())
    "celery's own"
"""

from __future__ import annotations

from typing import Any, Dict, List

from celery.app.task import Context
from celery.worker import state as worker_state
from celery.worker.request import Request

#: The names Celery does not count among a message's custom headers (as its
#: ``Context._get_custom_headers`` lists them).
_CELERY_FIELDS = frozenset({*Context.__dict__, "lang", "task", "argsrepr", "kwargsrepr",
                            "compression"})


def _made(fields: Dict[str, Any]) -> Context:
    """Celery's ``Context(fields)``, its custom headers found in one pass."""
    context = Context.__new__(Context)
    context.update(fields)
    if context.headers is None:
        context.headers = {name: value for name, value in fields.items()
                           if name not in _CELERY_FIELDS} or None
    return context


def _same_as_celery() -> bool:
    """Whether :func:`_made` makes what this Celery's ``Context`` makes (with custom
    headers, without, with a ``headers`` field of its own, with a time limit)."""
    samples: List[Dict[str, Any]] = [
        {"id": "1", "task": "t", "lang": "py", "args": [1], "kwargs": {}, "retries": 0,
         "timelimit": [10, 5], "argsrepr": "(1,)", "delivery_info": {"priority": 0},
         "redislock_wait": {"attempts": 1}, "custom": "x"},
        {"id": "2", "task": "t", "args": [], "kwargs": {"a": 1}, "timelimit": None},
        {"id": "3", "task": "t", "headers": {"h": 1}, "other": 2},
    ]
    try:
        return all(vars(_made(dict(sample))) == vars(Context(dict(sample)))
                   for sample in samples)
    except Exception:  # a Celery whose Context works otherwise
        return False


#: Whether :func:`context_of` makes the context itself (see above).
FAST = _same_as_celery()


def context_of(request: Any) -> Any:
    """``request._context``: made as Celery makes it, faster (see above), and kept as the
    request's own for Celery to use; Celery's own when it was made already."""
    own = getattr(request, "__dict__", None)
    if not FAST or own is None or "_context" in own or not hasattr(request, "_request_dict"):
        return request._context
    try:
        fields = request._request_dict
        _, _, embed = request._payload
    except (AttributeError, TypeError, ValueError):
        return request._context
    fields.update(**embed or {})  # as Celery's ``_context`` does
    context = _made(fields)
    request._context = context
    return context


def _reads_revocation() -> bool:
    """Whether this Celery's requests and revoked ids have what :func:`revoked` reads
    (as ``Request.revoked`` reads them)."""
    slots = getattr(Request, "__slots__", ())
    return (isinstance(getattr(worker_state.revoked, "_data", None), dict)
            and getattr(Request, "_already_revoked", None) is False
            and "_expires" in slots and "_request_dict" in slots)


#: Whether :func:`revoked` reads a request's revocation itself.
READS_REVOCATION = _reads_revocation()


def revoked(request: Any) -> bool:
    """``request.revoked()`` (which, revoked, announces it and acknowledges the message),
    answered False without a Python call when nothing can have revoked the request: not
    revoked already, no expiry, no stamped headers, its id not among the revoked ones."""
    if READS_REVOCATION:
        try:
            if not (request._already_revoked or request._expires
                    or request._request_dict.get("stamped_headers")
                    or request.id in worker_state.revoked._data):
                return False
        except AttributeError:  # not a request of Celery's: its own answer
            pass
    return bool(request.revoked())
