"""Server-Sent Events: a line parser (WHATWG "event stream interpretation") and a resuming stream.

`EventStream` reads `GET path` as `text/event-stream` and yields `Event`s. When the connection
drops (a transport error, a read timeout, a 5xx or 429 answer, or the server closing the stream while
the caller still iterates) it waits and reconnects with `Last-Event-ID` set to the id of the last event
it yielded, so no event is lost or repeated. The wait is the server's `retry:` value, doubled for
every consecutive connection that brought no event, capped at `max_delay`. After `max_failures`
such connections in a row it raises `StreamLost`; the caller decides whether to start over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from cli.client import Client, raise_for_problem


def is_transient(status_code: int) -> bool:
    """A server error or rate limit: worth reconnecting, unlike 401/404."""
    return status_code >= 500 or status_code == 429


class StreamLost(Exception):
    """`max_failures` consecutive connections brought no event."""


@dataclass(frozen=True)
class Event:
    id: str | None
    event: str
    data: str

    def json(self) -> dict[str, Any]:
        """`data` parsed as a JSON object; `{}` when it is not one (never raises)."""
        try:
            value = json.loads(self.data)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass
class EventParser:
    """Feed it lines without their terminator; it returns an `Event` at each blank line that ends one."""

    last_event_id: str | None = None
    retry_ms: int | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):  # comment, e.g. a keep-alive ping
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_event_id = value or None
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> Event | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return Event(id=self.last_event_id, event=event or "message", data="\n".join(data))


def parse(lines: Iterable[str]) -> Iterator[Event]:
    parser = EventParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event


class EventStream:
    """Iterate the events of `path`, reconnecting with Last-Event-ID until the caller stops."""

    def __init__(
        self,
        client: Client,
        path: str,
        *,
        last_event_id: str | None = None,
        read_timeout: float = 60.0,
        max_failures: int = 6,
        max_delay: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.path = path
        self.last_event_id = last_event_id
        self.read_timeout = read_timeout
        self.max_failures = max_failures
        self.max_delay = max_delay
        self.sleep = sleep
        self.retry_ms = 1000
        self.connections = 0
        self.last_error: Exception | None = None  # why the last connection ended early, for diagnostics

    def __iter__(self) -> Iterator[Event]:
        failures = 0
        while True:
            got_event = False
            try:
                for event in self._connect():
                    got_event = True
                    failures = 0
                    yield event
            except httpx.TransportError as exc:  # connect/read errors, timeouts, a body cut short
                self.last_error = exc
            if not got_event:
                failures += 1
                if failures >= self.max_failures:
                    raise StreamLost(f"no events from {self.path} after {failures} connection attempts")
            self.sleep(min(self.retry_ms / 1000 * 2 ** max(failures - 1, 0), self.max_delay))

    def _connect(self) -> Iterator[Event]:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        timeout = httpx.Timeout(10.0, read=self.read_timeout)
        self.connections += 1
        with self.client.http.stream("GET", self.path, headers=headers, timeout=timeout) as response:
            if is_transient(response.status_code):
                return
            raise_for_problem(response)
            parser = EventParser(last_event_id=self.last_event_id)
            for line in response.iter_lines():
                event = parser.feed(line)
                if parser.retry_ms is not None:
                    self.retry_ms = parser.retry_ms
                if event is not None:
                    self.last_event_id = event.id
                    yield event
