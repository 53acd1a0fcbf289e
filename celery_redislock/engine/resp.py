"""Redis's protocol (RESP2) for a caller that owns its socket, and the order of its replies.

For the worker's main process, which sends admissions without waiting on a socket that
its event loop watches (see :mod:`.hub_store`): commands are packed here,
the bytes read are parsed here, and :class:`Pipeline` keeps the callbacks of the commands
in flight in order, batches the commands queued while an ask waits for its reply, and
says when the oldest has waited too long. Nothing here touches a socket or a clock.

    >>> pack("GET", "k")
    b'*2\\r\\n$3\\r\\nGET\\r\\n$1\\r\\nk\\r\\n'
    >>> parser = Parser()
    >>> parser.feed(b"*2\\r\\n:1\\r\\n$2\\r\\nok\\r\\n-NOSCRIPT no\\r\\n")
    >>> parser.replies()
    [[1, b'ok'], ErrorReply('NOSCRIPT no')]
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, List, Tuple

#: What a command's callback gets: its reply (an :class:`ErrorReply` for an error), or
#: the exception that failed the connection before the reply came.
Then = Callable[[Any], None]


class ErrorReply(str):
    """An error reply of the server (``-ERR ...``), kept as a value, not raised."""

    def __repr__(self) -> str:
        return f"ErrorReply({str(self)!r})"


_Reader: Any
_pack_command: Any
try:  # redis-py's C helper (the ``hiredis`` extra): the same bytes, a third of the time
    from hiredis import Reader as _Reader
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - the pure-Python code below
    _Reader = _pack_command = None


def pack(*args: Any) -> bytes:
    """One command in RESP (bytes are sent as they are, anything else as its ``str``)."""
    if _pack_command is not None:
        try:
            return bytes(_pack_command(args))
        except TypeError:  # an argument it does not take (a bool, None): packed below
            pass
    return _pack(args)


def _pack(args: Tuple[Any, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class _Incomplete(Exception):
    """The buffer ends inside a reply."""


class Parser:
    """Replies parsed from the bytes fed, in order; a reply cut short waits for more."""

    def __init__(self, decode: bool = False) -> None:
        self._buffer = b""
        self._decode = decode
        #: hiredis's parser when it is installed (the same replies, in C).
        self._reader = None if _Reader is None else _Reader(
            protocolError=ValueError, replyError=ErrorReply,
            encoding="utf-8" if decode else None)

    def feed(self, data: bytes) -> None:
        if self._reader is not None:
            self._reader.feed(data)
        else:
            self._buffer += data

    def replies(self) -> List[Any]:
        """Every reply complete in the bytes fed so far (taken out of the buffer)."""
        done: List[Any] = []
        if self._reader is not None:
            gets = self._reader.gets
            reply = gets()
            while reply is not False:  # False: the rest is incomplete (RESP2 has no bools)
                done.append(reply)
                reply = gets()
            return done
        position = 0
        while position < len(self._buffer):
            try:
                reply, position = self._parse(position)
            except _Incomplete:
                break
            done.append(reply)
        self._buffer = self._buffer[position:]
        return done

    def _line(self, position: int) -> Tuple[bytes, int]:
        end = self._buffer.find(b"\r\n", position)
        if end < 0:
            raise _Incomplete
        return self._buffer[position:end], end + 2

    def _parse(self, position: int) -> Tuple[Any, int]:
        line, position = self._line(position)
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return self._text(rest), position
        if kind == b"-":
            return ErrorReply(rest.decode("utf-8", "replace")), position
        if kind == b":":
            return int(rest), position
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None, position
            if len(self._buffer) < position + size + 2:
                raise _Incomplete
            return self._text(self._buffer[position:position + size]), position + size + 2
        if kind == b"*":
            items: List[Any] = []
            for _ in range(max(0, int(rest))):
                item, position = self._parse(position)
                items.append(item)
            return (items if int(rest) >= 0 else None), position
        raise ValueError(f"not a RESP2 reply: {line[:40]!r}")

    def _text(self, data: bytes) -> Any:
        return data.decode() if self._decode else data


@dataclass
class Pipeline:
    """The commands of one connection: queued (``outbox``), then written, then answered
    in order. An *ask* is written at once when no earlier ask waits for its reply; else
    it waits for those replies, and every ask queued meanwhile goes in one write.

        >>> line = Pipeline()
        >>> line.queue(b"A", print, ask=True, now=0.0)
        True
        >>> line.take(), line.queue(b"B", print, ask=True, now=0.1)
        (b'A', False)
        >>> line.answered([1])
        [(<built-in function print>, 1)]
        >>> line.due(), line.take()
        (True, b'B')
    """

    outbox: List[bytes] = field(default_factory=list)
    #: Every command queued or written and not answered: (queued at, callback, ask).
    pending: Deque[Tuple[float, Then, bool]] = field(default_factory=deque)
    asks_queued: int = 0
    asks_unanswered: int = 0

    def queue(self, packed: bytes, then: Then, *, ask: bool, now: float) -> bool:
        """Queue a command; whether it (and what is queued with it) is to go now."""
        self.outbox.append(packed)
        self.pending.append((now, then, ask))
        if ask:
            self.asks_queued += 1
        return ask and self.asks_unanswered == 0

    def first(self, packed: bytes, then: Then) -> None:
        """Put a command ahead of everything queued (a new connection's handshake, when
        nothing is in flight)."""
        self.outbox.insert(0, packed)
        self.pending.appendleft((self.pending[0][0] if self.pending else float("inf"), then, False))

    def take(self) -> bytes:
        """What is queued, in one write (the asks among it are then in flight)."""
        data, self.outbox = b"".join(self.outbox), []
        self.asks_unanswered += self.asks_queued
        self.asks_queued = 0
        return data

    def answered(self, replies: List[Any]) -> List[Tuple[Then, Any]]:
        """The callbacks of the oldest commands, each with its reply."""
        done = []
        for reply in replies:
            _, then, ask = self.pending.popleft()
            if ask:
                self.asks_unanswered -= 1
            done.append((then, reply))
        return done

    def due(self) -> bool:
        """Whether asks queued while others were in flight may go now."""
        return self.asks_unanswered == 0 and self.asks_queued > 0

    def overdue(self, now: float, deadline: float) -> bool:
        """Whether the oldest command has waited more than ``deadline`` seconds."""
        return bool(self.pending) and now - self.pending[0][0] > deadline

    def fail(self, exc: BaseException) -> List[Tuple[Then, Any]]:
        """Forget everything queued or in flight: each callback with ``exc``."""
        pending, self.pending = self.pending, deque()
        self.outbox, self.asks_queued, self.asks_unanswered = [], 0, 0
        return [(then, exc) for _, then, _ in pending]

