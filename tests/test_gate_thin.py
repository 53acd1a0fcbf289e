"""The gate's thin path (``gate/thin.py``, ``engine/slots_ask.py``): taken for the
newcomers of slots-only tasks, and for nothing else; it sends the generic path's script
with the generic path's keys and arguments, and the same asks leave the same store
state and get the same answers (an admission's lease record, a refusal that parks the
run) by either path. The real-worker checks are the gate's own (``test_gate.py``,
``test_hand_on.py``...), whose slots-only tasks now ask through it."""

from __future__ import annotations

import re
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import redis
from celery import Celery
from celery.app.task import Context
from test_gate_lookahead import _Consumer  # a prefork worker's consumer, on an event loop

from celery_redislock import LimitedTask
from celery_redislock.config.limit import TaskLimits
from celery_redislock.engine.admission import declare_fresh
from celery_redislock.gate import main_process, thin
from celery_redislock.line.waiting import Parked
from celery_redislock.run.limited import limits_of
from celery_redislock.testing import RedisServer


def _app(url: str, **conf: Any) -> Celery:
    """An app with one task of each kind, its lock store at ``url``."""
    app = Celery("thin", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(**{"redislock_url": url, "redislock_gate": "async", **conf})
    options: Dict[str, Dict[str, Any]] = {
        "slots": {"lock_slots": 2, "lock_key": "thin"},
        "priority": {"lock_slots": 2, "lock_key": "thin-prio", "lock_priority": 7},
        "rated": {"lock_slots": 2, "lock_key": "thin-r", "lock_rate": "5/s"},
        "weighted": {"lock_slots": 4, "lock_key": "thin-w", "lock_cost": 2},
        "max_wait": {"lock_slots": 2, "lock_key": "thin-m", "lock_max_wait": 60},
        "fair": {"lock_slots": 2, "lock_key": "thin-f", "lock_fair_by": "{x}"},
        "by_key": {"lock_slots": 2, "lock_key": "thin-{x}"},
    }
    for name, extra in options.items():
        app.task(base=LimitedTask, name=name, shared=False, **extra)(_body)
    return app


def _body(x: str) -> None:  # pragma: no cover - never run here
    return None


def _limits(task: Any) -> TaskLimits:
    limits = limits_of(task)
    assert limits is not None
    return limits


class _Request:
    """A worker request as the gate reads it (the generic path reads its context)."""

    def __init__(self, task: Any, task_id: str, *, priority: Any = None,
                 redelivered: bool = False) -> None:
        self.task, self.id, self.hostname = task, task_id, "w1@host"
        self.argsrepr, self.kwargsrepr = "('a',)", "{}"
        self._request_dict = {
            "id": task_id, "task": task.name, "hostname": self.hostname, "retries": 0,
            "args": ["a"], "kwargs": {}, "argsrepr": self.argsrepr,
            "kwargsrepr": self.kwargsrepr,
            "delivery_info": {"priority": priority, "redelivered": redelivered}}
        self.delivery_info = self._request_dict["delivery_info"]
        self._context = Context(dict(self._request_dict))


class _Hold:
    copy, booked, waits = False, None, 0
    promises: Dict[str, int] = {}


class _Store:
    """The worker's connection to the store, run at once: the script's keys and
    arguments recorded, its reply handed on."""

    def __init__(self, client: Any) -> None:
        self.client, self.sent = client, []  # type: Any, List[Tuple[List[str], List[Any]]]

    def run_script(self, script: Any, keys: Any, args: Any, then: Any) -> None:
        self.sent.append((list(keys), list(args)))
        then(script.run(self.client, keys, args))


@pytest.fixture
def stores(redis_server: Any) -> Iterator[Tuple[Any, Any]]:
    """Two empty lock stores: one for each path."""
    other = RedisServer().start()
    clients = [redis_server.client(), other.client()]
    for client in clients:
        client.flushall()
        declare_fresh(client)
    try:
        yield redis_server, other
    finally:
        for client in clients:
            client.close()
        other.cleanup()


def _thin_asks(app: Celery, client: Any, name: str, ids: List[str],
               monkeypatch: Any, **request: Any) -> Tuple[List[Any], List[Any]]:
    """Ask for runs ``ids`` of task ``name`` through the thin path: what each got, and
    what was sent."""
    store, answers = _Store(client), []  # type: _Store, List[Any]
    monkeypatch.setattr(thin.Thin, "on", lambda self, consumer: store)
    gate = thin.Gate(
        act=lambda consumer, req, handle, hold, limits, answer, ahead: answers.append(answer),
        settle=lambda consumer, req, handle, hold, limits, step, ahead: answers.append(step()))
    task = app.tasks[name]
    slim = thin.thin_of(task, _limits(task))
    assert slim is not None
    for task_id in ids:
        assert thin.ask(slim, None, _Request(task, task_id, **request), print, _Hold(),
                        False, True, gate)
    return answers, store.sent


def _generic_asks(app: Celery, name: str, ids: List[str],
                  **request: Any) -> Tuple[List[Any], List[Any]]:
    """The same asks through the generic path (as the gate's ``_settle`` sends them)."""
    task, answers, sent = app.tasks[name], [], []  # type: Any, List[Any], List[Any]
    for task_id in ids:
        asking = main_process.asking_of(
            task, _limits(task), _Request(task, task_id, **request)._context, room=True,
            promises={}, may_wait=True, loop=True)
        assert asking is not None
        call = asking.call()
        assert call is not None
        sent.append((list(call.keys), list(call.args)))
        answers.append(asking.replied(call, call.script.run(asking.client, call.keys,
                                                            call.args)))
    return answers, sent


def _normal(text: Any, tokens: List[str]) -> str:
    """``text`` with holder tokens numbered by first use and every number as ``N``."""
    text = text.decode() if isinstance(text, bytes) else str(text)
    for index, token in enumerate(tokens):
        text = text.replace(token, f"<token {index}>")
    return re.sub(r"\d+", "N", text)


def _state(client: Any, tokens: List[str]) -> Dict[str, Any]:
    """Every key of the store, its type and contents, normalised (see :func:`_normal`)."""
    state: Dict[str, Any] = {}
    for key in sorted(client.keys("*")):
        kind = client.type(key).decode()
        if kind == "zset":
            value: Any = sorted(_normal(member, tokens) for member in client.zrange(key, 0, -1))
        elif kind == "hash":
            value = sorted((_normal(field, tokens), _normal(item, tokens))
                           for field, item in client.hgetall(key).items())
        elif kind == "string":
            value = _normal(client.get(key), tokens)
        else:
            value = kind
        state[_normal(key, tokens)] = (kind, value)
    return state


def _sent(keys: List[str], args: List[Any]) -> Tuple[List[str], List[Any]]:
    """A script call's keys and arguments but for the two that differ between two
    stores: the holder token (random) and the store incarnation seen (its clock's)."""
    return keys, [*args[1:9], *args[10:]]


def _comparable(answer: Any, tokens: List[str]) -> Any:
    """An answer without what differs between two stores and two clocks."""
    if isinstance(answer, Parked):
        return ("parked", answer.name, answer.ref.key)
    assert isinstance(answer, dict)
    return {key: _normal(value, tokens) for key, value in answer.items() if key != "taken"}


@pytest.mark.parametrize("name,request_fields", [
    ("slots", {}), ("slots", {"priority": 3}), ("priority", {})])
def test_the_thin_path_leaves_the_store_as_the_generic_path_does(
        stores: Tuple[Any, Any], monkeypatch: Any, name: str,
        request_fields: Dict[str, Any]) -> None:
    thin_server, generic_server = stores
    ids = ["t1", "t2", "t3"]  # two slots: two admitted, the third parks
    thin_client = redis.Redis.from_url(thin_server.database_url(0))
    thin_answers, thin_sent = _thin_asks(_app(thin_server.database_url(0)), thin_client,
                                         name, ids, monkeypatch, **request_fields)
    generic_answers, generic_sent = _generic_asks(_app(generic_server.database_url(0)),
                                                  name, ids, **request_fields)
    thin_tokens = [args[0] for _, args in thin_sent]
    generic_tokens = [args[0] for _, args in generic_sent]
    assert [_sent(keys, args) for keys, args in thin_sent] == [
        _sent(keys, args) for keys, args in generic_sent]
    assert [type(answer) for answer in thin_answers] == [dict, dict, Parked]
    assert [_comparable(answer, thin_tokens) for answer in thin_answers] == [
        _comparable(answer, generic_tokens) for answer in generic_answers]
    assert _state(thin_server.client(), thin_tokens) == _state(
        generic_server.client(), generic_tokens)


@pytest.mark.parametrize("name,taken", [
    ("slots", True), ("priority", True), ("rated", False), ("weighted", False),
    ("max_wait", False), ("fair", False), ("by_key", False)])
def test_the_thin_path_is_taken_for_slots_only_tasks(redis_server: Any, name: str,
                                                     taken: bool) -> None:
    task = _app(redis_server.database_url(0)).tasks[name]
    assert (thin.thin_of(task, _limits(task)) is not None) is taken


@pytest.mark.parametrize("conf", [{"redislock_gate": "blocking"},
                                  {"redislock_enabled": False}])
def test_no_thin_path_without_the_async_gate(redis_server: Any, conf: Dict[str, Any]) -> None:
    task = _app(redis_server.database_url(0), **conf).tasks["slots"]
    assert thin.thin_of(task, _limits(task)) is None


@pytest.mark.parametrize("hold,request_fields", [
    ({"copy": True}, {}), ({"promises": {"k": 1}}, {}), ({}, {"redelivered": True})])
def test_the_generic_path_asks_for_copies_redeliveries_and_held_runs(
        redis_server: Any, monkeypatch: Any, hold: Dict[str, Any],
        request_fields: Dict[str, Any]) -> None:
    task = _app(redis_server.database_url(0)).tasks["slots"]
    slim = thin.thin_of(task, _limits(task))
    assert slim is not None
    monkeypatch.setattr(thin.Thin, "on", lambda self, consumer: pytest.fail("asked"))
    held = _Hold()
    for field, value in hold.items():
        setattr(held, field, value)
    assert not thin.ask(slim, None, _Request(task, "t1", **request_fields), print, held,
                        False, True, thin.Gate(print, print))


class _Sent:
    """The worker's connection to the store, recording what is sent through it."""

    def __init__(self, sent: List[str]) -> None:
        self.sent = sent

    def run_script(self, script: Any, keys: Any, args: Any, then: Any) -> None:
        self.sent.append("thin")


class _Message:
    def __init__(self, headers: Dict[str, Any]) -> None:
        self.headers = headers


@pytest.mark.parametrize("name,headers,thin_path", [
    ("slots", {}, True), ("priority", {}, True), ("rated", {}, False),
    ("max_wait", {}, False), ("slots", {"redislock_wait": {"attempts": 1}}, False)])
def test_the_gate_asks_slots_only_newcomers_through_the_thin_path(
        redis_server: Any, monkeypatch: Any, name: str, headers: Dict[str, Any],
        thin_path: bool) -> None:
    from celery_redislock.gate import gate

    asked: List[str] = []
    monkeypatch.setattr(thin.Thin, "on", lambda self, consumer: _Sent(asked))
    monkeypatch.setattr(gate, "_settle", lambda *args, **kwargs: asked.append("generic"))
    task = _app(redis_server.database_url(0)).tasks[name]
    request = _Request(task, "t1")
    request.message = _Message(headers)  # type: ignore[attr-defined]
    request.revoked = lambda: False  # type: ignore[attr-defined]
    gate.gate(_Consumer(), request, pytest.fail)
    assert asked == ["thin" if thin_path else "generic"]


def test_a_failed_thin_ask_is_the_generic_paths_to_answer(redis_server: Any,
                                                           monkeypatch: Any) -> None:
    from redis.exceptions import ConnectionError

    class _Failing:
        def run_script(self, script: Any, keys: Any, args: Any, then: Any) -> None:
            then(ConnectionError("lost the lock store"))

    answers: List[Any] = []
    monkeypatch.setattr(thin.Thin, "on", lambda self, consumer: _Failing())
    gate = thin.Gate(act=pytest.fail, settle=lambda consumer, req, handle, hold, limits,
                     step, ahead: answers.append(step()))
    task = _app(redis_server.database_url(0)).tasks["slots"]
    slim = thin.thin_of(task, _limits(task))
    assert slim is not None
    try:
        assert thin.ask(slim, None, _Request(task, "t1"), print, _Hold(), False, True, gate)
        assert not main_process.store_asked()  # paused after the failure, as the generic
    finally:
        main_process.store_answered()
    assert [type(answer) for answer in answers] == [main_process.Later]
    assert answers[0].seconds == main_process.STORE_HOLD
