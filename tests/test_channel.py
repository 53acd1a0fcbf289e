"""The per-thread channel's requests sent without waiting, and the release built on them,
against real redis-servers."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any, List

import pytest
import redis.exceptions

from celery_redislock.engine import keeper as keeper_module
from celery_redislock.engine.admission import Lease, ParkedMove, SlotLimit, admit
from celery_redislock.engine.channel import channel_for, settle_all, unsettled
from celery_redislock.engine.keeper import lease_keeper
from celery_redislock.engine.parking import park_admit, run_id
from celery_redislock.line import handoff

from support import wait_until

#: How long the keeper leaves a thread's releases to it, as the package sets it.
SETTLE_AFTER = keeper_module.SETTLE_AFTER


@pytest.fixture(autouse=True)
def keeper_stays_out(monkeypatch):
    """The lease keeper's thread (running since an earlier test kept a lease) finishes
    what a thread left for 10 ms: here it waits, so that what these tests look at
    between two steps is what the steps left. The keeper's own tests set it back."""
    monkeypatch.setattr(keeper_module, "SETTLE_AFTER", 3600.0)


def keeper_takes_part(monkeypatch):
    monkeypatch.setattr(keeper_module, "SETTLE_AFTER", SETTLE_AFTER)


def test_replies_of_a_send_are_read_by_the_next_call_in_order(redis_client):
    channel = channel_for(redis_client)
    seen: List[List[Any]] = []
    channel.send(("SET", "a", "1"), ("INCR", "a"), then=seen.append)
    channel.send(("ECHO", "second"), then=seen.append)
    assert channel.unsettled and unsettled()
    # Redis applies one connection's commands in order: the sent ones come first.
    assert channel.call("GET", "a") == b"2"
    assert seen == [[b"OK", 2], [b"second"]]
    assert not channel.unsettled and not unsettled()


def test_an_error_reply_reaches_the_handler_not_the_next_caller(redis_client):
    channel = channel_for(redis_client)
    seen: List[List[Any]] = []
    channel.send(("EVAL", "return redis.error_reply('boom')", 0), ("PING",),
                 then=seen.append)
    assert channel.call("ECHO", "x") == b"x"
    (error, pong), = seen
    assert isinstance(error, redis.exceptions.ResponseError) and "boom" in str(error)
    assert pong in (b"PONG", True)


def test_a_failing_handler_is_logged_and_the_call_goes_on(redis_client, caplog):
    channel = channel_for(redis_client)

    def broken(replies: List[Any]) -> None:
        raise RuntimeError("handler bug")

    channel.send(("PING",), then=broken)
    with caplog.at_level("ERROR", logger="celery_redislock.engine.channel"):
        assert channel.call("ECHO", "still") == b"still"
    assert "handling a lock store reply failed" in caplog.text


def test_a_lost_connection_is_told_to_every_unread_handler(own_redis_server):
    client = own_redis_server.client()
    channel = channel_for(client)
    seen: List[List[Any]] = []
    channel.call("PING")  # connected
    own_redis_server.stop()
    # The first write after the server went away still succeeds (the kernel takes it);
    # the failure shows when the replies are read.
    channel.send(("PING",), ("PING",), then=seen.append)
    with pytest.raises(redis.exceptions.ConnectionError):
        channel.call("PING")
    assert len(seen) == 1 and len(seen[0]) == 2
    assert all(isinstance(reply, redis.exceptions.ConnectionError) for reply in seen[0])
    assert not channel.unsettled
    own_redis_server.restart()
    wait_until(lambda: _answers(channel), what="the channel to reconnect")


def test_a_request_left_unwritten_goes_out_in_the_next_write(own_redis_server):
    # A server of its own: the count of reads below is the server's, and any other
    # client of a shared server (a thread a test before left behind) adds to it.
    channel = channel_for(own_redis_server.client())
    seen: List[List[Any]] = []
    channel.call("PING")  # connected
    other = own_redis_server.client()
    writes_before = _reads_processed(other)
    channel.send(("SET", "later", "1"), then=seen.append, now=False)
    assert other.get("later") is None, "not written yet"
    assert channel.unsettled
    assert channel.call("INCR", "later") == 2  # the SET went first, in the same write
    assert seen == [[b"OK"]] and not channel.unsettled
    # Redis read the SET and the INCR at once (the GET above and INFO are the others').
    assert _reads_processed(other) - writes_before <= 3
    other.close()


def _reads_processed(client: Any) -> int:
    return int(client.info("stats")["total_reads_processed"])


def test_a_settler_writes_what_was_left_unwritten(redis_client, redis_server):
    channel = channel_for(redis_client)
    seen: List[List[Any]] = []
    channel.send(("SET", "settled", "1"), then=seen.append, now=False)
    settler = threading.Thread(target=settle_all)
    settler.start()
    settler.join()
    assert seen == [[b"OK"]] and not channel.unsettled
    other = redis_server.client()
    assert other.get("settled") == b"1"
    other.close()


def test_a_request_left_unwritten_on_a_lost_connection_is_told_to_its_handler(
        own_redis_server):
    client = own_redis_server.client()
    channel = channel_for(client)
    seen: List[List[Any]] = []
    channel.call("PING")
    own_redis_server.stop()
    channel.send(("PING",), then=seen.append, now=False)
    with pytest.raises(redis.exceptions.ConnectionError):
        channel.call("PING")
    assert len(seen) == 1 and isinstance(seen[0][0], redis.exceptions.ConnectionError)
    assert not channel.unsettled
    own_redis_server.restart()
    wait_until(lambda: _answers(channel), what="the channel to reconnect")


def _answers(channel: Any) -> bool:
    try:
        return channel.call("PING") in (b"PONG", True)
    except redis.exceptions.ConnectionError:
        return False


def test_another_thread_settles_replies_old_enough(redis_client):
    channel = channel_for(redis_client)
    seen: List[str] = []
    channel.send(("PING",), then=lambda replies: seen.append(threading.current_thread().name))
    settler = threading.Thread(target=settle_all, kwargs={"older_than": 3600}, name="early")
    settler.start()
    settler.join()
    assert seen == [] and channel.unsettled  # too young for that settler
    settler = threading.Thread(target=settle_all, name="settler")
    settler.start()
    settler.join()
    assert seen == ["settler"] and not channel.unsettled


# -- releases that do not wait ------------------------------------------------------------

def _uncontended_lease(client: Any, name: str) -> Lease:
    """A lease on a semaphore of two slots, taken while nobody waited: it leaves a slot
    free, so it is released without waiting for the answer."""
    lease = admit(client, [SlotLimit(name, 2, "redislock:")], lease=30,
                  reserve_ms=handoff.reservation_ms(30))
    assert isinstance(lease, Lease) and not lease._contended and not lease._took_last_slot
    return lease


def _fill_and_park(client: Any, lease: Lease, task_id: str) -> None:
    """Take the other slot, then park a run at the semaphore (its parked line)."""
    other = admit(client, [SlotLimit(lease.name, 2, "redislock:")], lease=30)
    assert isinstance(other, Lease) and other._took_last_slot
    _park(client, lease, task_id)


def _park(client: Any, lease: Lease, task_id: str) -> None:
    """Park a run at the (full) semaphore of ``lease``."""
    parked = park_admit(client, [SlotLimit(lease.name, 2, "redislock:")], lease=30,
                        run=run_id(task_id, 0))
    assert parked.park is not None  # every slot is held: it parks


def _moves(lease: Lease) -> List[ParkedMove]:
    """What a release of ``lease`` that hands its slot to the parked line owes."""
    return [ParkedMove(lease._keys[0])]


def test_release_soon_frees_the_slot_before_this_thread_asks_anything_else(redis_client):
    lease = _uncontended_lease(redis_client, "soon")
    handed: List[Any] = []
    lease.release_soon(handed.extend)
    assert channel_for(redis_client).unsettled
    again = admit(redis_client, [SlotLimit("soon", 1, "redislock:")], lease=30)
    assert isinstance(again, Lease), "the release was applied before the next admission"
    assert handed == [] and not channel_for(redis_client).unsettled
    again.release()


def test_release_soon_hands_the_slot_to_a_line_formed_meanwhile(redis_client):
    lease = _uncontended_lease(redis_client, "formed")
    _fill_and_park(redis_client, lease, "waiter-1")
    handed: List[Any] = []
    lease.release_soon(handed.extend)
    assert handed == []
    channel_for(redis_client).call("PING")  # this thread's next call reads the answer
    assert handed == _moves(lease)


def test_the_keeper_thread_hands_over_when_the_releasing_thread_goes_quiet(redis_client,
                                                                          monkeypatch):
    keeper_takes_part(monkeypatch)
    keeper = lease_keeper()
    lease = _uncontended_lease(redis_client, "quiet")
    keeper.keep(lease)  # the keeper's thread runs, as it does in every worker process
    keeper.forget(lease)
    _fill_and_park(redis_client, lease, "waiter-2")
    handed: List[Any] = []
    lease.release_soon(handed.extend)
    # No further call from this thread: the keeper reads the answer.
    wait_until(lambda: handed, timeout=5, what="the keeper to hand the slot over")
    assert handed == _moves(lease)


def test_a_release_left_for_the_next_request_frees_the_slot_with_it(redis_client):
    lease = _uncontended_lease(redis_client, "next")
    lease.release_soon(lambda messages: None, with_next_request=True)
    assert len(_live_holders(redis_client, lease)) == 1, "not written yet"
    again = admit(redis_client, [SlotLimit("next", 1, "redislock:")], lease=30)
    assert isinstance(again, Lease), "the release went first, in the same write"
    again.release()


def _live_holders(client: Any, lease: Lease) -> List[Any]:
    return client.zrangebyscore(lease._keys[0], 0, "+inf")


def test_the_keeper_writes_a_release_left_when_no_next_request_comes(redis_client,
                                                                     monkeypatch):
    keeper_takes_part(monkeypatch)
    keeper = lease_keeper()
    lease = _uncontended_lease(redis_client, "left")
    keeper.keep(lease)
    keeper.forget(lease)
    _fill_and_park(redis_client, lease, "waiter-4")
    handed: List[Any] = []
    lease.release_soon(handed.extend, with_next_request=True)
    wait_until(lambda: handed, timeout=5, what="the keeper to write the release")
    assert handed == _moves(lease)
    holders = [member.split(b" ", 1)[0] for member in _live_holders(redis_client, lease)]
    assert lease.token.encode() not in holders


@pytest.mark.parametrize("why", ["contended", "took the last slot"])
def test_release_soon_waits_for_the_answer_when_a_waiter_is_likely(redis_client, why):
    if why == "contended":
        lease = _uncontended_lease(redis_client, "likely")
        lease._contended = True  # as if a run had been refused before it was admitted
        _fill_and_park(redis_client, lease, "waiter-3")
    else:
        _uncontended_lease(redis_client, "likely")
        lease = admit(redis_client, [SlotLimit("likely", 2, "redislock:")], lease=30,
                      reserve_ms=handoff.reservation_ms(30))
        assert lease._took_last_slot and not lease._contended
        _park(redis_client, lease, "waiter-3")
    handed: List[Any] = []
    lease.release_soon(handed.extend)
    assert not channel_for(redis_client).unsettled
    assert handed == _moves(lease)


def test_a_young_lease_is_adopted_without_waiting(redis_client):
    """A lease another process of this machine took just now is adopted without waiting:
    the adoption is written at once (before the body starts), its answer read with the
    thread's next request; the release, left for the admission after it, follows it in
    order, so the slot comes back."""
    limit = SlotLimit("adopted", 2, "redislock:")
    first = admit(redis_client, [limit], lease=30)
    Lease.adopt(redis_client, first.handover(), '{"pid": 1}', answer_later=True).release()
    taken = admit(redis_client, [limit], lease=30)  # the script is known to the server now
    mine = Lease.adopt(redis_client, taken.handover(), '{"pid": 2}', answer_later=True)
    assert mine is not None and mine.token == taken.token
    assert channel_for(redis_client).unsettled, "the answer is not awaited"
    wait_until(lambda: _live_holders(redis_client, mine) == [mine._member.encode()],
               timeout=5, what="the adoption to be written")
    mine.release_soon(lambda messages: None, with_next_request=True)
    again = admit(redis_client, [limit], lease=30)  # reads the answer; writes the release
    assert isinstance(again, Lease)
    assert _live_holders(redis_client, mine) == [again._member.encode()]
    assert not mine.lost
    again.release()


def test_an_adoption_that_finds_the_lease_gone_reports_it_lost(redis_client):
    limit = SlotLimit("adopted-gone", 2, "redislock:")
    Lease.adopt(redis_client, admit(redis_client, [limit], lease=30).handover(), "{}",
                answer_later=True).release()
    taken = admit(redis_client, [limit], lease=30)
    redis_client.zrem(taken._keys[0], taken._member)  # an operator freed it meanwhile
    lost: List[Lease] = []
    mine = Lease.adopt(redis_client, taken.handover(), "{}", answer_later=True)
    lease_keeper().keep(mine, on_lost=lost.append)
    channel_for(redis_client).call("PING")  # the next request reads the adoption's answer
    assert mine.lost and lost == [mine]
    assert _live_holders(redis_client, mine) == []


def test_an_old_lease_is_adopted_at_once(redis_client):
    """Taken more than a third of a lease ago: adopted with the answer awaited, which
    may be that the lease ran out (None: the run asks anew)."""
    taken = admit(redis_client, [SlotLimit("adopted-old", 2, "redislock:")], lease=30)
    record = {**taken.handover(), "taken": taken.handover()["taken"] - 11}
    mine = Lease.adopt(redis_client, record, '{"pid": 3}', answer_later=True)
    assert _live_holders(redis_client, mine) == [mine._member.encode()]
    mine.release()


def test_a_semaphore_with_a_line_is_marked(redis_client):
    """Uncontended releases look for a line only in a semaphore marked contended
    ('#hold'): a run that parks marks it."""
    lease = _uncontended_lease(redis_client, "marked")
    key = lease._keys[0]
    assert redis_client.zscore(key, "#hold") is None
    _fill_and_park(redis_client, lease, "waiter-5")
    assert redis_client.zscore(key, "#hold") is not None
    handed: List[Any] = []
    lease.release_soon(handed.extend, with_next_request=True)
    channel_for(redis_client).call("PING")  # the release looks at the mark: a line
    assert handed == _moves(lease)


#: Run under gevent's monkey-patching, as Celery's gevent pool runs a worker: many
#: greenlets, each asking through ``channel_for`` as a task run does.
_GREENLETS = """
import sys
from gevent import monkey
monkey.patch_all()
import gevent
import redis
from celery_redislock.engine.channel import channel_for

client = redis.Redis.from_url(sys.argv[1], max_connections=3)
channels = set()

def ask(n):
    channel = channel_for(client)
    channels.add(id(channel))
    assert channel.call("ECHO", str(n)) == str(n).encode()
    gevent.sleep(0)
    assert channel.call_many(("ECHO", "a"), ("ECHO", str(n))) == [b"a", str(n).encode()]

gevent.joinall([gevent.spawn(ask, n) for n in range(200)], raise_error=True)
print(len(channels))
"""


def test_greenlets_of_a_thread_share_its_channel(redis_server):
    """Under gevent every task runs in a greenlet of its own: 200 greenlets (more than
    the pool's ``max_connections``) ask through one channel, each getting its own
    replies, instead of opening a connection each."""
    pytest.importorskip("gevent")
    done = subprocess.run([sys.executable, "-c", _GREENLETS, redis_server.url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


_INTERRUPTED = """
import sys
from gevent import monkey
monkey.patch_all()
import gevent
import redis
from celery_redislock.engine.channel import channel_for

client = redis.Redis.from_url(sys.argv[1])
seen = []

def interrupted():
    try:
        with gevent.Timeout(0.02):
            channel_for(client).call("BLPOP", "redislock-test-nothing", "0.2")
    except gevent.Timeout:
        seen.append("timeout")

def after():
    gevent.sleep(0.05)
    seen.append(channel_for(client).call("ECHO", "mine"))
    gevent.sleep(0.3)
    seen.append(channel_for(client).call("ECHO", "again"))

gevent.joinall([gevent.spawn(interrupted), gevent.spawn(after)], raise_error=True)
print(seen)
"""


def test_a_greenlet_interrupted_mid_request_leaves_no_reply_to_the_next(redis_server):
    """A greenlet interrupted while it waits for a reply (a time limit's
    ``gevent.Timeout``, a ``revoke(terminate=True)``) must not leave its reply on the
    connection that the thread's other greenlets share: the next request would read it
    as its own. redis-py drops a connection whose read or write was interrupted (so
    since 4.5.5), and the next request opens one."""
    pytest.importorskip("gevent")
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED, redis_server.url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['timeout', b'mine', b'again']"
