"""Worker starts, registered in the lock store so that a holder's owner is one start of
one worker, never just a node name.

Celery lets two workers share a node name (two ``celery worker`` started without ``-n`` on
one host are both ``celery@host``), so a name alone cannot tell a worker's own previous
life from a live namesake. Each start of a worker draws a random *start id*; its runs'
holder tokens are ``"<node>|<task id>|<start id>:<random>"`` (see
:func:`~celery_redislock.engine.admission.owner_prefix`), and the start registers itself
under ``<prefix>worker:<node>:<start id>`` with a lease that the lease keeper renews (a
:class:`WorkerRegistration` is kept like a lease). A registration says where the worker
runs (host, the space of process ids it sees, main process id and its start time), so
that a worker restarted where it ran knows at once that a namesake's registration whose
process is gone is dead, without waiting for its lease to run out; a registration from
elsewhere (another host or container) is taken as live until its lease runs out.

    >>> registry_prefix("redislock:", "celery@host")
    'redislock:worker:celery@host:'
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from redis.exceptions import RedisError

from .admission import saw_incarnation, seen_incarnation
from .scripts import REGISTER, is_cluster

logger = logging.getLogger(__name__)

#: Seconds a worker's registration lives without renewal (renewed every third of it).
REGISTRATION_LEASE = 30.0


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def new_start_id() -> str:
    """A random id for one start of a worker (12 hex digits)."""
    return os.urandom(6).hex()


def safe_node(node: str) -> str:
    """A node name as it appears in holder tokens and registry keys."""
    return node.replace("|", "_").replace(" ", "_").replace(":", "_")


def registry_prefix(prefix: str, node: str) -> str:
    """The start of the registry keys of every start of worker ``node``."""
    return f"{prefix}worker:{safe_node(node)}:"


def process_since(pid: int) -> Optional[str]:
    """When process ``pid`` started (clock ticks since boot, from ``/proc``), or None if it
    does not run (or is a zombie), or on a system without ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X", "x"):
        return None
    return fields[19]


class WorkerRegistration:
    """One start of a worker, registered in the lock store while it runs.

    It has what :class:`~celery_redislock.engine.keeper.LeaseKeeper` needs of a lease, so
    the worker's keeper renews it: a renewal writes it again (a registration lost with
    the lock store's data comes back at the next renewal)::

        registration = WorkerRegistration(client, "redislock:", "celery@host", start)
        registration.renew()                   # register
        lease_keeper().keep(registration)      # and keep it alive
        ...
        registration.unregister()
    """

    def __init__(self, client: Any, prefix: str, node: str, start: str,
                 lease: float = REGISTRATION_LEASE, grace: float = REGISTRATION_LEASE) -> None:
        self.client = client
        self.node = node
        self.start = start
        self.prefix = prefix
        self.key = registry_prefix(prefix, node) + start
        self.lease_seconds = lease
        #: The grace after a loss of the store's data that a renewal finds (seconds):
        #: the longest lease of the worker's limits.
        self.grace = grace
        self.name = f"worker registration {node} ({start})"
        self.token = self.key
        self.fence = 0
        self.lost = False
        pid = os.getpid()
        self.description = json.dumps({"host": socket.gethostname(), "space": process_space(),
                                       "pid": pid, "since": process_since(pid)})

    def renew(self) -> bool:
        """Write the registration with a fresh lease, and learn the store's incarnation
        (one script, see ``register.lua``). Always True: a registration is never given
        up; one that could not be written (the lock store unreachable, which the worker
        reports otherwise) is written at the next renewal."""
        try:
            born = REGISTER.run(self.client, [self.key], [
                self.description, _ms(self.lease_seconds), seen_incarnation(self.client),
                _ms(self.grace), "" if is_cluster(self.client) else self.prefix + "{",
            ])
        except RedisError as exc:  # the lock store's state is reported elsewhere
            logger.debug("celery-redislock: could not renew the %s: %r", self.name, exc)
            return True
        saw_incarnation(self.client, int(born))
        return True

    def unregister(self) -> None:
        """Remove the registration (the worker is leaving)."""
        self.client.delete(self.key)


def registrations(client: Any, prefix: str, node: str) -> Iterator[Tuple[str, str, Dict[str, Any]]]:
    """``(key, start id, description)`` of every registered start of worker ``node``."""
    start_at = registry_prefix(prefix, node)
    pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in start_at) + "*"
    for key in client.scan_iter(match=pattern, count=1000):
        key = key.decode() if isinstance(key, bytes) else key
        value = client.get(key)
        if value is None:
            continue
        try:
            description = json.loads(value)
        except ValueError:
            description = {}
        yield key, key[len(start_at):], description if isinstance(description, dict) else {}


def process_space() -> str:
    """Which process ids this process can see: the kernel's boot id and this process's
    pid namespace (two containers of one host, even with the same host name, differ), or
    the host name where ``/proc`` does not tell."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return socket.gethostname()


def is_dead_here(description: Dict[str, Any]) -> bool:
    """Whether a registration describes a worker whose main process ran where this one
    runs (same host, same process ids) and is gone (or is another process now)."""
    if description.get("host") != socket.gethostname():
        return False
    if description.get("space") != process_space():
        return False
    try:
        pid = int(str(description.get("pid")))
    except (TypeError, ValueError):
        return False
    since = process_since(pid)
    if since is None:  # gone, or no /proc to tell
        return Path("/proc/self/stat").exists() or not pid_runs(pid)
    return description.get("since") not in (None, since)


def pid_runs(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0; one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_starts(client: Any, prefix: str, node: str) -> List[str]:
    """The start ids of worker ``node`` that are registered and not known to be dead; the
    registrations of starts known dead (same host, process gone) are removed."""
    live = []
    for key, start, description in list(registrations(client, prefix, node)):
        if is_dead_here(description):
            client.delete(key)
            logger.info("celery-redislock: start %s of %s is dead (process %s gone)",
                        start, node, description.get("pid"))
        else:
            live.append(start)
    return live
