"""End to end: a lock store restarted *with* its data (AOF) while a run is adopted.

A worker's main process admits a run of a 1-slot key; the pool process that runs it
adopts the lease without waiting for the answer (``Lease.adopt(answer_later=True)``).
When the lock store was restarted since that process last talked to it, the answer is
an error: its connections were broken by the restart. The lease is still in the store
(its data was kept), so it must be adopted again on a new connection and renewed while
the body runs: a second run of the key must not be admitted beside it once the lease
would have run out (issue 27: the lease was marked lost, nobody renewed it, and a
second run was admitted beside the first). Counted from inside the bodies (see
:mod:`fault_app`); times on the record store's clock.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import TYPE_CHECKING

import pytest
from celery.utils.nodenames import worker_direct
from redis.exceptions import RedisError

from celery_redislock.engine.admission import Busy, Lease, SlotLimit, admit
from celery_redislock.engine.channel import channel_for

from cluster_checks import lock_store, peaks, record_store, slots_come_back, wait_until
from fault_app import ADOPTED, ADOPTED_LEASE, ADOPTED_PREFIX, create_app
from redis_process import RedisServer

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

#: Longest wait for anything the test waits for.
TIMEOUT = 60.0

#: How long the run adopted after the restart runs: well past its lease, and past the
#: 5 s the main processes ask no more after the restart broke their connections.
BODY_SECONDS = 2.5 * ADOPTED_LEASE


def restart_lock_store_with_data(cluster: WorkerCluster) -> None:
    """Make the lock store write every command to its append-only file, SIGKILL it, and
    start it again on the same port from that file."""
    server = cluster.lock_redis
    assert server is not None and server.process is not None
    store = lock_store(cluster)
    store.config_set("appendfsync", "always")
    store.config_set("appendonly", "yes")
    wait_until(lambda: _aof_ready(store.info("persistence")), TIMEOUT,
               "the append-only file to be written")
    keys_before = store.dbsize()
    store.close()
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    server.extra_args = [*server.extra_args, "--appendonly", "yes"]
    server.start()
    store = lock_store(cluster)
    assert store.dbsize() == keys_before, "the lock store came back without its data"
    store.close()


def _aof_ready(info: dict) -> bool:
    return (info.get("aof_enabled") == 1 and info.get("aof_rewrite_in_progress") == 0
            and info.get("aof_rewrite_scheduled") == 0)


@pytest.mark.slow
def test_an_adoption_answered_by_a_restart_keeps_its_lease(
        worker_cluster_factory: WorkerClusterFactory) -> None:
    cluster = worker_cluster_factory(workers=2, concurrency=1, app_module="fault_app",
                                     app_factory=create_app, separate_lock_store=True)
    record = record_store(cluster)
    task = cluster.app.tasks[ADOPTED]
    replies = cluster.app.control.ping(timeout=1.0) or []
    nodes = {node.split("@", 1)[0]: node for reply in replies for node in reply}
    first_queue, second_queue = (worker_direct(nodes[name]) for name in ("worker1", "worker2"))
    key = ADOPTED_PREFIX + "restart"

    # The pool process of worker1 talks to the store (its lease keeper too: the run lasts
    # past a third of its lease), then the store restarts, with its data.
    warm = task.apply_async((ADOPTED_LEASE / 2,), {"key": "warm"}, queue=first_queue)
    assert warm.get(timeout=TIMEOUT) == warm.id
    restart_lock_store_with_data(cluster)

    holder = task.apply_async((BODY_SECONDS,), {"key": "restart"}, queue=first_queue)
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")
    newcomer = task.apply_async((0.2,), {"key": "restart"}, queue=second_queue)

    assert holder.get(timeout=TIMEOUT + BODY_SECONDS) == holder.id
    assert newcomer.get(timeout=TIMEOUT) == newcomer.id
    assert peaks(record, key) == [1, 1], f"peaks: {peaks(record, key)}"
    assert record.hget("lost", holder.id) == "0"
    assert not record.hexists("lease_lost", holder.id)
    assert int(record.hget("started", newcomer.id)) >= int(record.hget("ended", holder.id))
    assert slots_come_back(cluster, key)
    log = cluster.worker("worker1").log_path.read_text()
    assert f"adopted its lease on '{key}' again" in log  # the adoption met the restart
    assert "LEASE LOST" not in log


def test_an_adoption_answered_while_the_store_is_down_is_done_by_a_renewal() -> None:
    """The engine's side: the answer to an adoption sent without waiting is an error,
    and the store does not answer a second try either (it is down): the lease is not
    lost, and its next renewal, once the store is back with its data, adopts it."""
    server = RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    server.start()
    try:
        client = server.client()
        limit = [SlotLimit("adopt-down", 1, "redislock:")]
        first = admit(client, limit, lease=30)
        # The first adoption on a connection pool waits for its answer (the server then
        # knows the script), later ones do not.
        assert Lease.adopt(client, first.handover(), '{"pid": 1}', answer_later=True).release()
        admitted = admit(client, limit, lease=30)
        assert admitted.holds_slots
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()

        adopted = Lease.adopt(client, admitted.handover(), '{"pid": 2}', answer_later=True)
        assert adopted is not None
        channel = channel_for(client)
        assert channel is not None
        with contextlib.suppress(RedisError):
            channel.settle()  # the answer: an error; adopting again fails too
        assert not adopted.lost

        server.start()  # with its data
        assert again_on_new_connection(adopted.renew) and not adopted.lost
        assert [member.decode().endswith('{"pid": 2}')
                for member in client.zrange(limit[0].key, 0, -1)
                if b" " in member] == [True]  # this process's member, renewed
        assert isinstance(admit(client, limit, lease=30), Busy)
        assert adopted.release()
        client.close()
    finally:
        server.cleanup()


def again_on_new_connection(call):
    """``call()``, once more if it met a connection the restart closed."""
    try:
        return call()
    except RedisError:
        return call()
