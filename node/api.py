"""The node's local API: a tiny HTTP/1.1 JSON server on trio, bound to 127.0.0.1 by default.

One request per connection, bounded header size and time, GET for queries and POST for the
few control actions. Handlers are plain functions from (path, query) to a JSON-able object; an
:class:`ApiError` becomes a status code, anything else a 500 — a bad request never reaches the
node's other tasks.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

import trio

from open1b.protocol import Open1bError

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 8192
REQUEST_TIMEOUT_S = 5.0

Handler = Callable[[list[str], dict[str, str]], Awaitable[Any]]


class ApiError(Open1bError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RawResponse:
    """A non-JSON body (e.g. Prometheus text) returned by a handler as is."""

    content_type: str
    body: bytes


@dataclass(frozen=True)
class Route:
    method: str
    prefix: str
    handler: Handler


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}


async def serve_api(host: str, port: int, routes: list[Route], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``routes`` until cancelled; reports the bound port through ``task_status``."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(lambda stream: _handle(stream, routes), listeners)


async def _handle(stream: trio.SocketStream, routes: list[Route]) -> None:
    try:
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            status, body = await _respond(stream, routes)
            if isinstance(body, RawResponse):
                content_type, payload = body.content_type, body.body
            else:
                content_type, payload = "application/json", json.dumps(body).encode()
            head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
            await stream.send_all(head.encode() + payload)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()


async def _respond(stream: trio.SocketStream, routes: list[Route]) -> tuple[int, Any]:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return 400, {"error": "incomplete request"}
        head += chunk
        if len(head) > MAX_REQUEST_HEAD:
            return 400, {"error": "request head too large"}
    try:
        method, target, _ = head.split(b"\r\n", 1)[0].decode("ascii").split(" ", 2)
    except ValueError:
        return 400, {"error": "malformed request line"}
    url = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    path = [p for p in url.path.split("/") if p]
    for route in routes:
        parts = [p for p in route.prefix.split("/") if p]
        if path[: len(parts)] == parts:
            if method != route.method:
                return 405, {"error": f"use {route.method}"}
            try:
                return 200, await route.handler(path[len(parts):], query)
            except ApiError as exc:
                return exc.status, {"error": str(exc)}
            except Exception:  # a failing handler must not take the daemon down
                log.exception("API handler failed for %s", url.path)
                return 500, {"error": "internal error"}
    return 404, {"error": f"no such endpoint {url.path}"}
