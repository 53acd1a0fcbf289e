"""The app-level settings of celery-redislock, and the Redis client they describe.

=========================  ==============================================================
``redislock_url``          Redis URL of the lock store: ``redis://``, ``rediss://``,
                           ``unix://`` or ``sentinel://`` (see :mod:`.sentinel`). Unset:
                           the broker URL if it is a Redis URL, else the result
                           backend's if it is one, else ``redis://localhost:6379/0``.
``redislock_transport_options``
                           For ``sentinel://``: ``{"master_name": ...}`` and optionally
                           ``"sentinel_kwargs"``, as in kombu's transport options.
``redislock_client``       A ready redis-py client (or a callable returning one), used
                           instead of ``redislock_url``.
``redislock_key_prefix``   Start of every Redis key the package writes
                           (default ``"redislock:"``).
``redislock_enabled``      ``False`` switches every limit off: task bodies run with no
                           Redis call at all (for unit tests). Default ``True``.
``redislock_fail_open``    ``True`` runs a task *without a slot* when the lock store
                           cannot be reached, instead of re-queueing it (the default,
                           ``False``, fails closed). The limit is then not enforced.
                           A store that answers but refuses (full, permissions) never
                           fails open.
``redislock_signing_key``  No effect any more: it signed the messages the retired
                           ``"store"`` line parked in the lock store, which holds none
                           now. Still checked (``str`` or ``bytes``, at least 16 bytes),
                           so that a configuration that sets it loads.
``redislock_require_noeviction``
                           ``True``: a worker refuses to start unless the lock store's
                           ``maxmemory-policy`` is ``noeviction`` (default ``False``:
                           it logs a warning).
``redislock_admit_before_pool``
                           ``True`` (the default): a worker asks a run's limits in its
                           main process, before the pool, so that a run that waits is
                           never a run to Celery (no prerun/postrun, no STARTED).
                           ``False``: the pool process asks, as the body is about to run
                           (a wait then shows to Celery as a run that ended IGNORED);
                           one lock-store request less per run, for throughput-bound
                           apps of very short tasks (see docs/benchmarks.md).
``redislock_gate``         How the worker's main process asks the lock store before the
                           pool: ``"async"`` (the default) sends the admissions on a
                           connection driven by the worker's event loop, batched, and
                           never waits (prefork and solo pools with a ``redis://`` or
                           ``unix://`` store; others ask blocking); ``"blocking"`` waits
                           for each answer (at most 1 s).
``redislock_hand_on``      ``True`` (the default): with admission before the pool, a
                           worker hands the uncontended slot of a run that ended to its
                           next run of the same slots-only limits waiting for a pool
                           process, with no lock-store request (at most 8 runs in a row
                           per slot, within 0.5 s of its admission). ``False``: every
                           slot goes back through the lock store.
``redislock_standby``      ``True``: with the async gate, a worker running runs of a
                           parked line (one semaphore of cost 1) holds the line's next
                           run as a *standby*, with no slot, and hands it the slot of
                           such a run that ends there in one lock-store call (no move,
                           no broker hop); see ``gate/standby.py``. Default ``False``.
``redislock_line``         Where a refused run waits: ``"broker"``, the only value (the
                           *parking line*: one message in a parking queue of the broker,
                           the lock store keeping only references). ``"store"``, the old
                           line's, is retired: a worker whose app still names it says so
                           as it starts, and its runs park as on ``"broker"``.
``redislock_rate_recheck`` Seconds (default 1.0): a run promised a rate start further
                           away asks again after at least this long (and a tenth of its
                           wait), so that a rate changed at run time reaches it; ``None``:
                           runs come back only for their promised start.
``redislock_max_lease``    Seconds (default: unset): the longest lease any holder may
                           have, if longer than the longest lease of this app's limited
                           tasks. After the lock store lost its data, no slot is granted
                           afresh for that long; set it where processes of other apps
                           share keys with longer leases.
=========================  ==============================================================
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

import redis

from ..engine.keys import DEFAULT_PREFIX, check_prefix
from ..errors import LockConfigurationError
from .sentinel import SCHEME, sentinel_master

DEFAULT_URL = "redis://localhost:6379/0"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", SCHEME)

#: The values of ``redislock_line``: the parking line only.
LINES = ("broker",)

#: The retired value of ``redislock_line`` (the old line: a copy sent back with a
#: countdown, and its message parked in the lock store): read as :data:`DEFAULT_LINE`,
#: with a warning as the worker starts (:func:`..gate.startup.line_deprecation`).
RETIRED_LINE = "store"

#: ``redislock_line`` when not set.
DEFAULT_LINE = "broker"


@dataclass(frozen=True)
class Settings:
    """The package's settings as read from one Celery app's configuration."""

    url: str
    prefix: str
    enabled: bool
    client: Any = None
    transport_options: Mapping[str, Any] = field(default_factory=dict)
    fail_open: bool = False
    signing_key: Optional[bytes] = field(default=None, repr=False)
    require_noeviction: bool = False
    #: ``redislock_rate_recheck``: how soon (s) a run promised a rate start asks again
    #: at the earliest; None: only for its start.
    rate_recheck: Optional[float] = 1.0
    #: ``redislock_admit_before_pool``: limits asked in the worker's main process.
    admit_before_pool: bool = True
    #: ``redislock_gate``: ``"blocking"`` or ``"async"`` (see :data:`GATES`).
    gate: str = "async"
    #: ``redislock_line``: ``"broker"`` (see :data:`LINES`).
    line: str = DEFAULT_LINE
    #: ``redislock_hand_on``: an ended run's slot handed on in the worker (see
    #: :mod:`~..gate.hand_on`).
    hand_on: bool = True
    #: ``redislock_standby``: the line's next run held in the worker as a standby (see
    #: :mod:`~..gate.standby`).
    standby: bool = False
    #: ``redislock_max_lease``: the longest lease (s) of any holder, at least; None: the
    #: longest lease of the app's limited tasks.
    max_lease: Optional[float] = None


def read_settings(app: Any) -> Settings:
    """Read and check the ``redislock_*`` settings of ``app``.

    Raises :class:`LockConfigurationError` naming the setting that is wrong.
    """
    conf = app.conf
    enabled = conf.get("redislock_enabled", True)
    if not isinstance(enabled, bool):
        raise LockConfigurationError(
            f"setting redislock_enabled must be True or False, not {enabled!r}"
        )
    url, options = _lock_store_of(conf)
    if not isinstance(url, str) or not url.startswith(REDIS_SCHEMES):
        raise LockConfigurationError(
            "setting redislock_url must be a redis://, rediss://, unix:// or sentinel:// "
            f"URL, not {url!r}"
        )
    if not isinstance(options, Mapping):
        raise LockConfigurationError(
            f"setting redislock_transport_options must be a dict, not {options!r}"
        )
    prefix = check_prefix(conf.get("redislock_key_prefix", DEFAULT_PREFIX))
    return Settings(url=url, prefix=prefix, enabled=enabled,
                    client=conf.get("redislock_client"), transport_options=options,
                    fail_open=_flag(conf, "redislock_fail_open", False),
                    signing_key=_signing_key(conf),
                    require_noeviction=_flag(conf, "redislock_require_noeviction", False),
                    rate_recheck=_rate_recheck(conf),
                    admit_before_pool=_flag(conf, "redislock_admit_before_pool", True),
                    gate=_gate(conf), line=_line(conf),
                    hand_on=_flag(conf, "redislock_hand_on", True),
                    standby=_flag(conf, "redislock_standby", False),
                    max_lease=_seconds(conf, "redislock_max_lease"))


def _flag(conf: Any, name: str, default: bool) -> bool:
    """The setting ``name``, which must be True or False."""
    value = conf.get(name, default)
    if not isinstance(value, bool):
        raise LockConfigurationError(f"setting {name} must be True or False, not {value!r}")
    return value


#: The values of ``redislock_gate``.
GATES = ("blocking", "async")


def _gate(conf: Any) -> str:
    """``redislock_gate``: one of :data:`GATES`."""
    value = conf.get("redislock_gate", Settings.gate)
    if value not in GATES:
        raise LockConfigurationError(
            f"setting redislock_gate must be 'blocking' or 'async', not {value!r}")
    return str(value)


def _line(conf: Any) -> str:
    """``redislock_line``: one of :data:`LINES` (the retired :data:`RETIRED_LINE` is read
    as the default)."""
    value = conf.get("redislock_line", DEFAULT_LINE)
    if value == RETIRED_LINE:
        return DEFAULT_LINE
    if value not in LINES:
        raise LockConfigurationError(
            f"setting redislock_line must be 'broker' (the parking line; 'store' is "
            f"retired), not {value!r}")
    return str(value)


def _rate_recheck(conf: Any) -> Optional[float]:
    """``redislock_rate_recheck``: a positive number of seconds, or None."""
    value = conf.get("redislock_rate_recheck", 1.0)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value < float("inf")):
        raise LockConfigurationError("setting redislock_rate_recheck must be a number of "
                                     f"seconds above zero, or None, not {value!r}")
    return float(value)


def _seconds(conf: Any, name: str) -> Optional[float]:
    """The setting ``name``: a positive number of seconds, or None when unset."""
    value = conf.get(name)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value < float("inf")):
        raise LockConfigurationError(f"setting {name} must be a number of seconds above "
                                     f"zero, or None, not {value!r}")
    return float(value)


#: The shortest signing key accepted (bytes).
MIN_SIGNING_KEY = 16


def _signing_key(conf: Any) -> Optional[bytes]:
    """``redislock_signing_key`` as bytes, or None when unset."""
    key = conf.get("redislock_signing_key")
    if key is None or key == "" or key == b"":
        return None
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes) or len(key) < MIN_SIGNING_KEY:
        raise LockConfigurationError(
            f"setting redislock_signing_key must be a str or bytes of at least "
            f"{MIN_SIGNING_KEY} bytes (e.g. secrets.token_hex(32)), not a "
            f"{type(key).__name__} of {len(key) if isinstance(key, bytes) else '?'} bytes")
    return key


def _lock_store_of(conf: Any) -> Tuple[Any, Any]:
    """The lock store's URL and transport options: its own, else the broker's, else the
    result backend's (when they are Redis), else the default."""
    own = conf.get("redislock_url")
    if own:
        return own, conf.get("redislock_transport_options") or {}
    for url_setting, options_setting in (("broker_url", "broker_transport_options"),
                                         ("result_backend", "result_backend_transport_options")):
        url = _redis_url_of(conf.get(url_setting))
        if url:
            return url, conf.get(options_setting) or {}
    return DEFAULT_URL, {}


def _redis_url_of(url: Any) -> Optional[str]:
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    if isinstance(url, str):
        if url.startswith(SCHEME):
            return url  # every sentinel of the list
        first = url.split(";")[0].strip()
        if first.startswith(REDIS_SCHEMES):
            return first
    return None


_clients: Dict[Tuple[int, str], Any] = {}
_clients_guard = threading.Lock()


def redis_client(app: Any, settings: Optional[Settings] = None) -> Any:
    """The Redis client that holds ``app``'s semaphores, made once per app and URL.

    redis-py's connection pool notices a fork and opens new connections in the child,
    so one client serves every process of a prefork worker.
    """
    settings = settings or read_settings(app)
    if settings.client is not None and not callable(settings.client):
        return settings.client
    cache_key = (id(app), settings.url if settings.client is None else repr(settings.client))
    client = _clients.get(cache_key)
    if client is None:
        with _clients_guard:
            client = _clients.get(cache_key)
            if client is None:
                if settings.client is not None:
                    client = settings.client()
                elif settings.url.startswith(SCHEME):
                    client = sentinel_master(
                        settings.url, settings.transport_options, socket_timeout=10,
                        socket_connect_timeout=5,
                    )
                else:
                    client = redis.Redis.from_url(
                        settings.url, socket_timeout=10, socket_connect_timeout=5,
                        health_check_interval=30,
                    )
                _clients[cache_key] = client
    return client
