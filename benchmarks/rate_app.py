"""The Celery app of the rate benchmark, loaded both by the workers and by the sender.

Every URL comes from the environment, as in ``worker_app``:

``REDISLOCK_BENCH_BROKER_URL``    broker
``REDISLOCK_BENCH_BACKEND_URL``   result backend
``REDISLOCK_BENCH_LOCK_URL``      lock store (``redislock_url``)
``REDISLOCK_BENCH_RECORDS_URL``   where runs record their admissions (default: the lock
                                  store; the benchmark puts them on another server, so
                                  that the lock store's command counts are the limits')
``REDISLOCK_BENCH_RATES``         the rates to measure, comma-separated, each ``rate`` or
                                  ``rate:burst``: ``"20/s,50/s,5/s:5"``
``REDISLOCK_BENCH_PREFETCH``      the workers' ``worker_prefetch_multiplier`` (default:
                                  Celery's, 4)
``REDISLOCK_BENCH_RATE_RECHECK``  the workers' ``redislock_rate_recheck`` in seconds, or
                                  ``none`` (default: the package's, 1 s)
``REDISLOCK_BENCH_TRACE``         ``"1"``: also record every refusal (task id and the start
                                  it was promised) through the ``rate_limited`` signal

Each rate gets a plain no-op task, ``bench.rate.<index>``, limited only through the
``redislock_limits`` setting and :func:`celery_redislock.install`. The limit's key is the
task's ``run`` argument, so every batch has a rate limiter of its own that starts idle.
A run that is admitted records, with one ``XADD`` to ``bench:rate:<run>`` in the records
database, the Redis time at which the limits admitted it
(``self.request.redislock_lease.acquired_at_ms``) and the time the sender sent it.
With tracing on, each refusal adds one ``XADD`` to ``bench:rate:refused:<limit name>``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import redis
from celery import Celery

import celery_redislock
from celery_redislock import Rate
from celery_redislock.integration import signals

BROKER_ENV = "REDISLOCK_BENCH_BROKER_URL"
BACKEND_ENV = "REDISLOCK_BENCH_BACKEND_URL"
LOCK_ENV = "REDISLOCK_BENCH_LOCK_URL"
RECORDS_ENV = "REDISLOCK_BENCH_RECORDS_URL"
RATES_ENV = "REDISLOCK_BENCH_RATES"
TRACE_ENV = "REDISLOCK_BENCH_TRACE"
PREFETCH_ENV = "REDISLOCK_BENCH_PREFETCH"
RECHECK_ENV = "REDISLOCK_BENCH_RATE_RECHECK"
DEFAULT_RATES = "20/s,50/s,5/s:5"

QUEUE = "redislock-bench-rate"
WARMUP_TASK = "bench.rate.warmup"
#: The warm-up task's rate: high enough that it never waits long.
WARMUP_RATE = "1000/s"


@dataclass(frozen=True)
class RateConfig:
    """One configuration to measure: a rate, its burst and the task limited by them."""

    text: str
    burst: int
    task_name: str

    @property
    def rate(self) -> Rate:
        """The parsed rate."""
        return Rate.parse(self.text, self.burst)

    @property
    def label(self) -> str:
        """How the configuration is shown in reports."""
        return self.text + (f" burst {self.burst}" if self.burst > 1 else "")


def parse_rates(text: str) -> List[RateConfig]:
    """``"20/s,5/s:5"`` as configurations, checked (a bad rate raises at once)."""
    configs = []
    for index, item in enumerate(part.strip() for part in text.split(",") if part.strip()):
        rate, _, burst = item.partition(":")
        Rate.parse(rate.strip(), int(burst or 1))  # fails now, before any worker starts
        configs.append(RateConfig(rate.strip(), int(burst or 1), f"bench.rate.{index}"))
    if not configs:
        raise ValueError(f"{RATES_ENV} names no rate")
    return configs


def limit_name(run: str) -> str:
    """The name of batch ``run``'s rate limiter (what ``key`` of the limit renders)."""
    return f"rate:{run}"


def records_key(run: str) -> str:
    """The stream in which the runs of batch ``run`` record their admissions."""
    return f"bench:rate:{run}"


def refusals_key(name: str) -> str:
    """The stream of the refusals of the rate limiter ``name`` (with tracing on)."""
    return f"bench:rate:refused:{name}"


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"environment variable {name} is not set")
    return value


CONFIGS = parse_rates(os.environ.get(RATES_ENV) or DEFAULT_RATES)

app = Celery(
    "redislock_bench_rate",
    broker=_required_env(BROKER_ENV),
    backend=_required_env(BACKEND_ENV),
)
app.conf.update(
    redislock_url=_required_env(LOCK_ENV),
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
if os.environ.get(PREFETCH_ENV):
    app.conf.worker_prefetch_multiplier = int(os.environ[PREFETCH_ENV])
if os.environ.get(RECHECK_ENV):
    recheck = os.environ[RECHECK_ENV]
    app.conf.redislock_rate_recheck = None if recheck == "none" else float(recheck)


def limits_setting(configs: List[RateConfig]) -> Dict[str, Dict[str, Any]]:
    """The ``redislock_limits`` entries: one rate per task, keyed by the batch's run id."""
    setting = {
        config.task_name: {
            "rate": config.text, "burst": config.burst, "key": limit_name("{run}"),
        }
        for config in configs
    }
    setting[WARMUP_TASK] = {"rate": WARMUP_RATE, "key": limit_name("{run}")}
    return setting


app.conf.redislock_limits = limits_setting(CONFIGS)

_records_client: Optional[redis.Redis] = None


def _records() -> redis.Redis:
    """This process's client of the records, made on first use (after any fork)."""
    global _records_client
    if _records_client is None:
        _records_client = redis.Redis.from_url(
            os.environ.get(RECORDS_ENV) or _required_env(LOCK_ENV))
    return _records_client


def record_admission(task: Any, run: str, sent_ms: float) -> None:
    """Record when the limits admitted this run, and when it was sent (one ``XADD``)."""
    lease = task.request.redislock_lease
    _records().xadd(records_key(run), {
        "admitted_ms": lease.acquired_at_ms, "sent_ms": repr(sent_ms),
        "task_id": task.request.id or "", "worker": task.request.hostname or "",
        "pid": os.getpid(),
    })


def _define_task(name: str) -> None:
    """Register the no-op task ``name``, which only records its admission."""

    @app.task(name=name, bind=True)
    def probe(self: Any, run: str, sent_ms: float) -> None:
        """Do nothing but record the admission."""
        record_admission(self, run, sent_ms)


for _name in [config.task_name for config in CONFIGS] + [WARMUP_TASK]:
    _define_task(_name)

celery_redislock.install(app)


def record_refusal(sender: Any = None, task_id: str = "", key: str = "", promise: int = 0,
                   countdown: float = 0.0, **_: Any) -> None:
    """Record one refusal by a rate limit: which run, and the start it was promised."""
    _records().xadd(refusals_key(key), {
        "task_id": task_id or "", "promise_us": promise, "countdown": repr(countdown),
    })


if os.environ.get(TRACE_ENV) == "1":
    signals.rate_limited.connect(record_refusal, weak=False)
