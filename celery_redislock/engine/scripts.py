"""The Lua scripts of the engine, loaded from the ``.lua`` files beside this module.

Each script is sent once per connection pool with ``EVALSHA``; when the server does not
know it yet (first use, or after a restart or ``SCRIPT FLUSH``) it is sent whole with
``EVAL``, which also caches it. Either way one call is one round trip.

On Redis 7 and later each script declares its flags (a ``#!lua`` first line): a script
that writes is then refused whole, with ``OOM``, when the server is full under
``noeviction``. Without flags Redis lets a script write past ``maxmemory`` once its
first write was a deletion (which every script here starts with), so a full store
would keep growing. Redis 6.2 does not know the ``#!lua`` line: on the first such
refusal the connection pool is marked and gets the scripts without it.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any, Dict, List, Optional, Sequence, Tuple

from redis import Redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError, ResponseError

from .channel import channel_for


class LuaScript:
    """A Lua script file, run atomically on the Redis server.

    Example::

        script = LuaScript.load("release.lua")
        released = script.run(client, keys=[semaphore], args=[member])
    """

    def __init__(self, name: str, source: str, flags: str = "") -> None:
        self.name = name
        #: For Redis 7 and later: with its flags declared (none: it may write, and is
        #: refused whole when the server is out of memory).
        self.source = f"#!lua flags={flags}\n{source}" if flags else f"#!lua\n{source}"
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        #: For Redis 6.2, which does not know flags.
        self.plain_source = source
        self.plain_sha = hashlib.sha1(source.encode()).hexdigest()

    @classmethod
    def load(cls, filename: str, *, after: Sequence[str] = (), flags: str = "") -> LuaScript:
        """The script in ``lua/<filename>``, with the files named in ``after`` (shared
        functions) put in front of it."""
        folder = resources.files(__package__).joinpath("lua")
        parts = [folder.joinpath(name).read_text("utf-8") for name in (*after, filename)]
        return cls(filename, "\n".join(parts), flags)

    def evalsha(self, client: Any) -> Tuple[str, str]:
        """The start of an ``EVALSHA`` of this script on ``client``'s server, for a
        caller that sends it itself (it must handle ``NoScriptError``)."""
        holder = getattr(client, "connection_pool", client)
        return "EVALSHA", self.plain_sha if getattr(holder, _PLAIN, False) else self.sha

    def eval_again(self, client: Any, error: str) -> Optional[Tuple[str, str]]:
        """For a caller that sent :meth:`evalsha` itself and got the error reply
        ``error``: the start of the ``EVAL`` to send instead (the server did not know the
        script; or, Redis before 7, its flags), or None when the error is the script's."""
        holder = getattr(client, "connection_pool", client)
        plain = getattr(holder, _PLAIN, False)
        if error.startswith("NOSCRIPT"):
            return "EVAL", self.plain_source if plain else self.source
        if not plain and "Error compiling script" in error:
            setattr(holder, _PLAIN, True)
            return "EVAL", self.plain_source
        return None

    def run(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run the script on ``client`` (a redis-py client, or a cluster client when every
        key is in one hash slot)."""
        channel = channel_for(client)
        call = channel.call if channel is not None else client.execute_command
        holder = getattr(client, "connection_pool", client)
        plain = getattr(holder, _PLAIN, False)
        try:
            return call("EVALSHA", self.plain_sha if plain else self.sha, len(keys), *keys,
                        *args)
        except NoScriptError:
            try:
                return call("EVAL", self.plain_source if plain else self.source, len(keys),
                            *keys, *args)
            except ResponseError as exc:
                if plain or "Error compiling script" not in str(exc):
                    raise
                setattr(holder, _PLAIN, True)  # Redis before 7: no flags
                return call("EVAL", self.plain_source, len(keys), *keys, *args)


#: Marks a connection pool (or cluster client) whose server does not know script flags.
_PLAIN = "_redislock_plain_scripts"


#: Shared functions put in front of the scripts that hand out slots: the store's
#: incarnation (store.lua), weighted holders (units.lua), the parked line (parking.lua,
#: with its fair sub-lines: fair.lua, its weighted runs: parked_cost.lua, its companions'
#: names: parked_names.lua, its references' claims: parked_claims.lua, references whose
#: copy may never come: parked_unsent.lua, a rate's line re-planned: rate_plan.lua, and
#: its runs' deadlines: deadline.lua), then a semaphore's limit and its hand-over to its
#: parked line (line.lua).
LINE = ["store.lua", "units.lua", "fair.lua", "parked_cost.lua", "parked_names.lua", "parking.lua",
        "parked_claims.lua", "parked_unsent.lua", "rate_plan.lua", "deadline.lua", "line.lua"]

#: The admissions by mode, over the same preludes (admit_args.lua: the arguments and
#: replies; admit_semaphore.lua, admit_rates.lua: each kind of limiter): semaphores only,
#: rate limiters only, both.
ADMIT_SLOTS = LuaScript.load("admit_slots.lua", after=[
    *LINE, "admit_args.lua", "admit_semaphore.lua"])
ADMIT_RATE = LuaScript.load("admit_rate.lua", after=[
    "units.lua", "line.lua", "admit_args.lua", "admit_rates.lua"])
ADMIT = LuaScript.load("admit.lua", after=[
    *LINE, "admit_args.lua", "admit_semaphore.lua", "admit_rates.lua"])
RELEASE = LuaScript.load("release.lua", after=LINE)
RENEW = LuaScript.load("renew.lua", after=["store.lua", "units.lua", "parked_names.lua"])
REGISTER = LuaScript.load("register.lua", after=["store.lua"])
FRESH = LuaScript.load("fresh.lua", after=["store.lua"])
RELEASE_OWNER = LuaScript.load("release_owner.lua", after=LINE)
WAKE = LuaScript.load("wake.lua", after=LINE)
REFUND = LuaScript.load("refund.lua")
HOLDERS = LuaScript.load("holders.lua", flags="no-writes")
AVAILABLE = LuaScript.load("available.lua", after=["units.lua", "line.lua"], flags="no-writes")
OWNED = LuaScript.load("owned.lua")
FOLLOW = LuaScript.load("follow.lua", after=["units.lua", "line.lua"], flags="no-writes")
ADOPT = LuaScript.load("adopt.lua", after=["units.lua", "parked_names.lua"])
#: The parked line (parking.lua; see :mod:`.parking`).
ADMIT_PARKED = LuaScript.load("admit_parked.lua",
                              after=[*LINE, "parked_admit.lua", "parked_rates.lua",
                                     "parked_args.lua"])
DUE = LuaScript.load("due.lua", after=LINE)
PARKED = ["units.lua", "fair.lua", "parked_cost.lua", "parked_names.lua", "parking.lua",
          "parked_claims.lua"]
MOVED_NOTHING = LuaScript.load("moved_nothing.lua", after=PARKED)
#: A message taken from a fair sub-line by a move owed from the line's own queue
#: (``lua/fair_took.lua``).
FAIR_TOOK = LuaScript.load("fair_took.lua", after=PARKED)
STARTED = LuaScript.load("started.lua", after=PARKED)
PARKED_SENT = LuaScript.load("parked_sent.lua", after=[*PARKED, "parked_unsent.lua"])
LEAVE_PARKED = LuaScript.load("leave_parked.lua", after=LINE)
KEEP_LATE = LuaScript.load("keep_late.lua", after=["units.lua", "parked_names.lua"])


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client, whose scripts must keep to one hash slot."""
    return type(client) is not Redis and isinstance(client, RedisCluster)


def by_hash_slot(client: Any, keys: Sequence[str]) -> List[List[str]]:
    """``keys`` in groups that one script may take: one group, or one per Cluster slot."""
    if not is_cluster(client) or len(keys) < 2:
        return [list(keys)]
    groups: Dict[int, List[str]] = {}
    for key in keys:
        groups.setdefault(key_slot(key.encode() if isinstance(key, str) else key), []).append(key)
    return list(groups.values())
