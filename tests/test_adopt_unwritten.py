"""An adoption sent without waiting that could not even be written.

A pool process adopts the lease its worker's main process was admitted to without
waiting for the answer (``Lease.adopt(answer_later=True)``): the request is written on
the process's channel, its answer read later. After the lock store restarted (here
empty, as without persistence), the channel's connection is one the restart broke: the
first request written on it is answered by an error, and a second one written before
that answer was read fails as it is written. That second adoption was dropped: the run
went on as if adopted, its renewals found no member of its own (``LEASE LOST`` a third
of a lease later), and once the lease admitted ran out a second run was admitted beside
it (a long history run without persistence, seed 11: ``long6`` at 2 slots of 1, just
after the grace that followed an empty restart). A real lock store, restarted.
"""

from __future__ import annotations

import time

import redis

from celery_redislock.engine.admission import Busy, Lease, SlotLimit, admit

#: The leases here (s): the grace after the restart lasts one.
LEASE = 1.5


def _admitted_after_the_grace(client: redis.Redis, limit: list) -> Lease:
    deadline = time.monotonic() + 10 * LEASE
    while time.monotonic() < deadline:
        try:
            outcome = admit(client, limit, lease=LEASE)
        except redis.ConnectionError:  # a connection the restart broke
            continue
        if isinstance(outcome, Lease):
            return outcome
        time.sleep(0.05)
    raise AssertionError("nothing admitted after the grace")


def test_an_adoption_that_could_not_be_written_is_done_again(own_redis_server):
    main, pool = own_redis_server.client(), own_redis_server.client()
    other = [SlotLimit("other", 2, "redislock:")]
    long = [SlotLimit("long", 1, "redislock:")]
    # The first adoption on a connection pool waits for its answer; later ones do not.
    assert Lease.adopt(pool, admit(main, other, lease=LEASE).handover(), '{"pid": 1}',
                       answer_later=True).release()
    own_redis_server.restart()  # empty; the pool's channel keeps its broken connection

    first = _admitted_after_the_grace(main, other)
    admitted = admit(main, long, lease=LEASE)
    assert isinstance(admitted, Lease)
    earlier = Lease.adopt(pool, first.handover(), '{"pid": 2}', answer_later=True)
    adopted = Lease.adopt(pool, admitted.handover(), '{"pid": 2}', answer_later=True)
    assert earlier is not None and adopted is not None and not adopted.lost

    assert adopted.renew(), "left unadopted: its renewal found no member of its own"
    holders = [member for member in main.zrange(long[0].key, 0, -1) if b" " in member]
    assert len(holders) == 1 and holders[0].endswith(b'{"pid": 2}')
    # Past the end of the lease as admitted: the adopted one, renewed, still holds the slot.
    while time.time() < admitted.expires_at_ms / 1000 + 0.3:
        time.sleep(LEASE / 4)
        assert adopted.renew() and not adopted.lost
    assert isinstance(admit(main, long, lease=LEASE), Busy)
    assert adopted.release() and earlier.release()
    main.close()
    pool.close()
