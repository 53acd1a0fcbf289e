"""A moved message's backup on a Redis broker (``parking/lua/move.lua``, ``claimed.lua``,
``restore.lua``): kept until a worker that received the copy claims it, else put back at
the front of its parking queue; each backup claimed or restored, never both. On a
private redis-server, with kombu's own consumer as the worker."""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any, Iterator, List

import kombu
import pytest
import redis
from celery import Celery
from test_keep_late import hand_over, reservations
from test_parking_broker import make_app, receive, send, task_value

from celery_redislock.engine import late
from celery_redislock.engine.admission import ParkRef
from celery_redislock.line import poll
from celery_redislock.parking import Done, Mover, ParkedCopy, broker_for, line_name, redis_line
from celery_redislock.parking.naming import MOVED_PREFIX, MOVING, WAIT_HEADER

from redis_process import RedisServer
from support import wait_until

KEY = "redislock:{t}:s:backup"
WAIT = {"v": 2, "park_id": "p-1", "line": KEY}


@pytest.fixture
def client(redislock_server: RedisServer) -> Iterator[redis.Redis]:
    """Database 6 of the session's private redis-server, emptied: the broker."""
    client = redislock_server.client(db=6)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def app(redislock_server: RedisServer, client: redis.Redis) -> Celery:
    return make_app(redislock_server.database_url(6))


def park(app: Celery, broker: Any, value: str, job: str) -> ParkedCopy:
    send(app, value)
    copy = ParkedCopy.of(receive(app, "work"), KEY, WAIT)
    assert broker.park(copy, job).done
    return copy


def park_and_move(app: Celery, broker: Any, value: str) -> ParkedCopy:
    """A run parked and moved back to its queue: its parked copy."""
    copy = park(app, broker, value, f"park-{value}")
    assert broker.move(copy.queue, f"move-{value}").done
    return copy


def move_id(message: Any) -> str:
    return str(message.headers[WAIT_HEADER]["move"])


def test_a_move_keeps_a_backup_until_the_copy_is_claimed(app: Celery,
                                                         client: redis.Redis) -> None:
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        copy = park(app, broker, "a", "park-a")
        assert broker.move(copy.queue, "move-a").what == "moved"
        moved = receive(app, "work")
        move = move_id(moved)
        assert client.zscore(MOVING, move) is not None
        assert client.hget(MOVED_PREFIX + move, "q") == copy.queue.encode()
        assert 0 < client.ttl(MOVED_PREFIX + move) <= redis_line.BACKUP_LIFE
        assert broker.claimed(move) is True
        assert broker.claimed(move) is False  # once only
        assert client.zcard(MOVING) == 0 and not client.exists(MOVED_PREFIX + move)
        assert broker.restore().put_back == []


def test_an_unclaimed_backup_is_put_back_first_in_its_line(
        app: Celery, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_line, "RESTORE_AFTER_MS", 2000)
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        copy = park(app, broker, "first", "park-1")
        assert broker.move(copy.queue, "move-1").done
        lost = client.rpop("work")  # a consumer popped it and died before kombu kept it
        assert lost is not None
        assert broker.registry() == {}  # its parking queue was empty: forgotten
        park(app, broker, "second", "park-2")
        assert broker.restore().put_back == []  # not due yet
        wait_until(lambda: client.zrangebyscore(MOVING, "-inf", _now_ms(client)) != [],
                   10.0, what="the backup to be due")
        restored = broker.restore().put_back
        assert [queue for _, queue in restored] == [copy.queue]
        lost_id = json.loads(lost)["headers"][WAIT_HEADER]["move"]
        assert restored[0][0] == lost_id + "r"  # a copy id of its own
        assert broker.registry() == {copy.queue: KEY}
        assert broker.claimed(lost_id) is False  # the copy received late: too late
        assert broker.move(copy.queue, "move-2").done  # it kept its place
        again = receive(app, "work")
        assert task_value(again) == "first" and move_id(again) == restored[0][0]
        assert json.loads(client.hget(MOVED_PREFIX + restored[0][0], "m"))[
            redis_line.MOVE_FIELD] == restored[0][0]  # backed up again, under its new id
        assert client.lindex(copy.queue, 0) is not None  # "second" still waits


def test_a_copy_still_in_its_queue_is_late_not_lost(
        app: Celery, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A due backup whose copy is still in the queue it was moved to (the workers are
    busy) is not put back: looked for again later, and put back once the copy is gone
    unclaimed."""
    monkeypatch.setattr(redis_line, "RESTORE_AFTER_MS", 0)
    monkeypatch.setattr(redis_line, "RECHECK_MS", 0)
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        copy = park(app, broker, "late", "park-late")
        assert broker.move(copy.queue, "move-late").done
        send(app, "queued after it")  # pushed on the other end: the copy is still next
        found = broker.restore(consumed=["work"])
        assert found.put_back == [] and client.zcard(MOVING) == 1
        assert [line for _, line in found.late] == [KEY]  # late: its reservation is kept
        assert client.llen(copy.queue) == 0
        assert client.rpop("work") is not None  # popped, and its consumer died
        assert [queue for _, queue in broker.restore().put_back] == [copy.queue]
        assert client.llen(copy.queue) == 1 and client.zcard(MOVING) == 0


def test_a_copy_in_a_queue_longer_than_the_look_counts_as_still_there(
        app: Celery, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue longer than QUEUED_DEPTH is not searched (each look stays that cheap): a
    copy not received there counts as late, and a lost one is put back once the queue
    is shorter."""
    monkeypatch.setattr(redis_line, "RESTORE_AFTER_MS", 0)
    monkeypatch.setattr(redis_line, "RECHECK_MS", 0)
    monkeypatch.setattr(redis_line, "QUEUED_DEPTH", 2)
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        copy = park_and_move(app, broker, "deep")
        assert client.rpop("work") is not None  # popped, and its consumer died
        for value in ("b", "c", "d"):
            send(app, value)  # a longer queue than the look
        found = broker.restore(consumed=["work"])
        assert found.put_back == [] and found.late == []  # presumed there, not seen
        assert [line for _, line in found.presumed] == [KEY]
        assert client.rpop("work") is not None  # the queue shorter: searched, not there
        assert [queue for _, queue in broker.restore().put_back] == [copy.queue]


def test_a_copy_in_a_queue_no_worker_consumes_is_not_named_late(
        app: Celery, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy still in a queue that no running worker's poll named within CONSUMED_MS
    is neither named (its reservation lapses as any: nobody will take it) nor put back
    (it is still there); named again once some worker consumes the queue, also in a
    priority step's list of it."""
    monkeypatch.setattr(redis_line, "RESTORE_AFTER_MS", 0)
    monkeypatch.setattr(redis_line, "RECHECK_MS", 0)
    monkeypatch.setattr(redis_line, "CONSUMED_MS", 300)
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        park_and_move(app, broker, "orphan")
        found = broker.restore(consumed=["other"])
        assert found.put_back == [] and found.late == [] and found.presumed == []
        assert client.zcard(MOVING) == 1 and client.llen("work") == 1
        assert [line for _, line in broker.restore(consumed=["work"]).late] == [KEY]
        start = _now_ms(client)
        wait_until(lambda: _now_ms(client) > start + 400, 5.0, what="the mark to lapse")
        assert broker.restore().late == []  # no worker named it since
        client.rename("work", "work" + connection.default_channel.sep + "3")
        client.hset(MOVED_PREFIX + client.zrange(MOVING, 0, 0)[0].decode(), "t",
                    "work" + connection.default_channel.sep + "3")
        assert [line for _, line in broker.restore(consumed=["work"]).late] == [KEY]


def test_a_copy_not_received_is_lost_only_after_restore_after(
        app: Celery, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backup is first looked at FIRST_LOOK_MS after its move (a late copy's
    reservation is kept from then on); a copy neither queued nor received then is put
    back only RESTORE_AFTER_MS after its move."""
    monkeypatch.setattr(redis_line, "FIRST_LOOK_MS", 0)
    monkeypatch.setattr(redis_line, "RESTORE_AFTER_MS", 3000)
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        copy = park_and_move(app, broker, "young")
        assert client.rpop("work") is not None  # popped, and its consumer died
        found = broker.restore()
        assert found.due == 1 and found.put_back == [] and found.late == []
        assert client.zcard(MOVING) == 1
        wait_until(lambda: client.zrangebyscore(MOVING, "-inf", _now_ms(client)) != [],
                   10.0, what="the backup to be due again")
        assert [queue for _, queue in broker.restore().put_back] == [copy.queue]


def test_a_late_copy_is_lost_only_restore_after_its_last_sighting(
        app: Celery, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy seen in its queue, then taken off it, is given RESTORE_AFTER_MS from that
    sighting for its claim (a late copy's claim is as late as a fresh one's), not from
    its move: put back at once, it would run twice should the store have lost the
    reference that ends the second."""
    monkeypatch.setattr(redis_line, "FIRST_LOOK_MS", 0)
    monkeypatch.setattr(redis_line, "RESTORE_AFTER_MS", 3000)
    monkeypatch.setattr(redis_line, "RECHECK_MS", 0)
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        copy = park_and_move(app, broker, "sighted")
        moved_at = _now_ms(client)

        def still_late() -> bool:
            return bool(broker.restore(consumed=["work"]).late) and \
                _now_ms(client) > moved_at + 3500
        wait_until(still_late, 10.0, what="the copy to be seen late past RESTORE_AFTER_MS")
        assert client.rpop("work") is not None  # taken, acknowledged, its claim late
        assert broker.restore().put_back == [] and client.zcard(MOVING) == 1
        wait_until(lambda: client.zrangebyscore(MOVING, "-inf", _now_ms(client)) != [],
                   10.0, what="the backup to be due again")
        assert [queue for _, queue in broker.restore().put_back] == [copy.queue]


def test_a_copy_received_but_not_yet_claimed_is_not_put_back(
        app: Celery, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A due backup whose copy a worker received (kombu keeps it in its ``unacked``
    hash until acknowledged) but whose claim has not reached the broker (its mover is
    slow) is dropped, not put back: put back, the copy would run twice should the lock
    store have lost the reference that ends the second."""
    monkeypatch.setattr(redis_line, "RESTORE_AFTER_MS", 0)
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        copy = park(app, broker, "received", "park-received")
        assert broker.move(copy.queue, "move-received").done
    got: List[Any] = []
    with app.connection_for_read() as connection:
        consumer = kombu.Consumer(connection, [kombu.Queue("work", routing_key="work")],
                                  accept=["json"], on_message=got.append, prefetch_count=1)
        with consumer:
            def received() -> bool:
                with contextlib.suppress(TimeoutError):
                    connection.drain_events(timeout=0.2)
                return bool(got)
            wait_until(received, 10.0, what="the moved copy received")
            assert client.hlen("unacked") == 1  # kombu keeps it, unacknowledged
            assert broker.restore().put_back == []
            assert client.llen(copy.queue) == 0 and client.zcard(MOVING) == 0
            assert broker.claimed(move_id(got[0])) is False  # its backup was dropped
            got[0].ack()


def test_a_message_parked_without_a_move_id_moves_without_a_backup(
        app: Celery, client: redis.Redis) -> None:
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        copy = park(app, broker, "old", "park-old")
        payload = json.loads(client.lindex(copy.queue, 0))
        del payload[redis_line.MOVE_FIELD]  # as an older version parked it
        client.lset(copy.queue, 0, json.dumps(payload))
        assert broker.move(copy.queue, "move-old").done
        assert task_value(receive(app, "work")) == "old"
        assert client.zcard(MOVING) == 0


def test_claim_and_restore_take_each_backup_once(
        app: Celery, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Racing on every backup, each due at once: each is claimed or restored, never both
    and never neither."""
    monkeypatch.setattr(redis_line, "RESTORE_AFTER_MS", 0)
    rounds = 60
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        queue = ""
        for i in range(rounds):
            queue = park(app, broker, f"v{i}", f"park-{i}").queue
        for i in range(rounds):
            assert broker.move(queue, f"move-{i}").done
    moves = [json.loads(raw)["headers"][WAIT_HEADER]["move"]
             for raw in client.lrange("work", 0, -1)]
    assert len(set(moves)) == rounds
    client.delete("work")  # popped by consumers that have not claimed them yet
    claimed: List[str] = []
    restored: List[str] = []

    def claim_all() -> None:
        with app.connection_for_write() as connection:
            broker = broker_for(connection)
            claimed.extend(move for move in moves if broker.claimed(move))

    def restore_all() -> None:
        with app.connection_for_write() as connection:
            broker = broker_for(connection)
            while client.zcard(MOVING):
                restored.extend(move[:-1] for move, _ in broker.restore(limit=3).put_back)

    threads = [threading.Thread(target=claim_all), threading.Thread(target=restore_all)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30.0)
    assert sorted(claimed + restored) == sorted(moves)
    print(f"\n{len(claimed)} claimed, {len(restored)} put back")
    assert client.llen(queue) == len(restored)
    assert not client.keys(MOVED_PREFIX + "*")


def _now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_the_mover_claims_on_its_thread(app: Celery, client: redis.Redis) -> None:
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        copy = park(app, broker, "m", "park-m")
        assert broker.move(copy.queue, "move-m").done
    move = move_id(receive(app, "work"))
    mover = Mover(app.connection_for_write).start()
    done: List[Done] = []
    ended = threading.Event()
    try:
        assert mover.claim(move, lambda d: (done.append(d), ended.set()))
        assert ended.wait(10.0)
    finally:
        mover.stop()
    assert done[0].ok and done[0].kind == "claim"
    assert client.zcard(MOVING) == 0


def park_message(app: Celery, broker: Any, key: str, ref: ParkRef, value: str) -> None:
    """A run refused by the lock store (``ref``) parked at ``key``."""
    send(app, value)
    wait = {"v": 2, "park_id": ref.park_id, "line": key}
    assert broker.park(ParkedCopy.of(receive(app, "work"), key, wait), f"park-{value}").done


def test_the_poll_keeps_a_queued_copys_reservation_and_puts_a_lost_one_back(
        app: Celery, client: redis.Redis, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs parked on a key of two slots, both moved: one copy is still in its queue
    when the backups are due (late: its reservation is kept), the other was popped by a
    consumer that died (lost: put back in its parking queue, no reservation kept)."""
    monkeypatch.setattr(redis_line, "RESTORE_AFTER_MS", 0)
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, parked = hand_over(redis_client, 2, slots=2)
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        for busy, value in zip(parked, ("lost", "late")):
            assert busy.park is not None
            park_message(app, broker, key, busy.park, value)
        parking = broker.registry()
        assert list(parking.values()) == [line_name(key)]
        [parking_queue] = parking
        assert broker.move(parking_queue, "move-1").done  # "lost" (parked first)
        popped = client.rpop("work")  # popped by a consumer that died
        assert popped is not None
        assert broker.move(parking_queue, "move-2").done  # "late", still queued
        ends = dict(reservations(redis_client, key))
        poll.restore(broker, redis_client, ["work"])
        kept = dict(reservations(redis_client, key))
        assert sorted(kept) == sorted(ends)
        assert sum(kept[m] > ends[m] + 15_000 for m in kept) == 1  # one kept, for "late"
        assert client.llen(parking_queue) == 1  # "lost" is back in its queue
        lost_move = json.loads(popped)["headers"][WAIT_HEADER]["move"]
        assert json.loads(client.lindex(parking_queue, 0))["headers"][
            WAIT_HEADER]["move"] == lost_move + "r"
        assert client.zcard(MOVING) == 1  # "late" looked for again later
