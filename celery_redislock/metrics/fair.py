"""Fair limits' waits by tenant without one series per tenant (issue 29).

A limit with ``fair_by`` serves its parked line round-robin across the keys it renders
(its *tenants*, ``"tenant:acme"``). Exporting one series per tenant would grow without
bound; instead each process keeps, per (task, limit label), a :class:`TenantWaits`: the
exponentially weighted mean wait of the last :data:`MAX_TENANTS` tenants admitted
(least recently admitted dropped first), and the recorder exports the quantiles of
those means across tenants (:data:`QUANTILES`) as one gauge per quantile. So
``fair_tenant_wait_seconds{quantile="0.9"}`` = 4 reads: 90 % of the recently admitted
tenants waited 4 s or less on average, the rest more (one tenant starved shows in
``quantile="1"``, the worst mean).

    >>> waits = TenantWaits(max_tenants=3, alpha=0.5)
    >>> for tenant, waited in [("a", 1.0), ("b", 3.0), ("a", 3.0), ("c", 9.0), ("d", 0.0)]:
    ...     waits.add(tenant, waited)
    >>> sorted(waits.means().items())  # "b", the least recently admitted, is dropped
    [('a', 2.0), ('c', 9.0), ('d', 0.0)]
    >>> waits.quantiles((0.5, 1.0))
    {0.5: 2.0, 1.0: 9.0}
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Dict, Sequence

__all__ = ["ALPHA", "MAX_TENANTS", "QUANTILES", "TenantWaits", "quantile_label"]

#: How many tenants a :class:`TenantWaits` remembers (the most recently admitted).
MAX_TENANTS = 200

#: Weight of a new wait in a tenant's mean (its last ~5 admissions count most).
ALPHA = 0.2

#: The quantiles across tenants exported (1: the worst tenant's mean).
QUANTILES = (0.5, 0.9, 0.99, 1.0)


def quantile_label(q: float) -> str:
    """The ``quantile`` label of ``q``.

        >>> quantile_label(0.5), quantile_label(1.0)
        ('0.5', '1')
    """
    return f"{q:g}"


class TenantWaits:
    """The recent mean wait (s) of each of the last ``max_tenants`` tenants admitted."""

    def __init__(self, max_tenants: int = MAX_TENANTS, alpha: float = ALPHA) -> None:
        self.max_tenants = max(1, int(max_tenants))
        self.alpha = alpha
        self._means: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, tenant: str, waited: float) -> None:
        """A run of ``tenant`` was admitted after waiting ``waited`` seconds."""
        waited = max(0.0, float(waited))
        with self._lock:
            mean = self._means.pop(tenant, None)
            self._means[tenant] = waited if mean is None else (
                mean + self.alpha * (waited - mean))
            while len(self._means) > self.max_tenants:
                self._means.popitem(last=False)

    def means(self) -> Dict[str, float]:
        """``{tenant: its recent mean wait}``, least recently admitted first."""
        with self._lock:
            return dict(self._means)

    def quantiles(self, qs: Sequence[float] = QUANTILES) -> Dict[float, float]:
        """The quantiles ``qs`` of the tenants' means (nearest rank); empty without any."""
        with self._lock:
            values = sorted(self._means.values())
        if not values:
            return {}
        count = len(values)
        return {q: values[min(count - 1, max(0, math.ceil(q * count) - 1))] for q in qs}
