"""The node's local API server: an ASGI app (:mod:`.api_routes`) served by Hypercorn's trio
worker inside the daemon's own trio process, behind :class:`ApiGuard`.

Loopback is not authentication (design.md, invariant 8): any web page the operator visits can
make the browser send requests to 127.0.0.1, and a DNS-rebinding page can even read the answers.
So every request passes the guard first:

* ``Host`` must name a loopback host or the address the API is bound to (DNS rebinding);
* an ``Origin`` header, when a browser sends one, must be the API's own origin or one the
  operator configured (``api_origins``): a cross-site form POST is refused (CSRF);
* a mutating request (any method but GET and HEAD) must carry the data dir's token as
  ``Authorization: Bearer <token>``; so must every request when the API is bound to a
  non-loopback address. Read-only requests on loopback need no token.

No CORS header is ever sent unless the operator configured origins.
"""

from __future__ import annotations

import hmac
import json
import logging
from functools import partial
from typing import Awaitable, Callable

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from open1b.protocol import Open1bError

from .config import LOOPBACK_NAMES, is_loopback

log = logging.getLogger(__name__)
# Hypercorn's own messages, warnings and up only: its "Running on …" line repeats the daemon's own
# listening line, and a daemon that fails to start must print one line, not two.
_server_log = logging.getLogger(__name__ + ".hypercorn")
_server_log.setLevel(logging.WARNING)

SAFE_METHODS = frozenset({"GET", "HEAD"})
# A request's head must arrive within this: Hypercorn's keep-alive timer runs from the connection's
# start until a head is whole (a head trickling in is cut off), and no route reads a body (Hypercorn
# closes a connection whose body is left unread). Not Hypercorn's read timeout: that fires whenever
# the client has sent nothing for so long, which a page's event stream always is (it ended every 5 s).
REQUEST_TIMEOUT_S = 5.0
# h11 refuses a request head still incomplete past this size (a head that arrives whole in one
# read of up to 64 KiB is parsed): what a slow or huge head can make the server hold is bounded.
MAX_REQUEST_HEAD = 16384

Asgi = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class ApiError(Open1bError):
    """A request the routes refuse: ``status`` and a one-line message, answered as ``{"error": …}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ApiBindError(Open1bError):
    """The API could not listen where it was told to (port in use, address not local)."""


def _hostname(value: str) -> str:
    """``host[:port]`` or ``[v6]:port`` → the host, lower-cased, without brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class ApiGuard:
    """ASGI middleware that refuses, before any route runs, what a web page elsewhere could send
    (module docstring). ``bound_host`` is the address the API listens on; ``origins`` the extra
    origins the operator allows (they also get CORS headers, from the app)."""

    def __init__(self, app: Asgi, *, token: str, bound_host: str, origins: tuple[str, ...] = ()) -> None:
        self.app, self.token, self.origins = app, token, frozenset(o.rstrip("/").lower() for o in origins)
        self.hosts = LOOPBACK_NAMES | ({bound_host.lower()} if bound_host not in ("0.0.0.0", "::", "") else set())
        self.reads_need_token = not is_loopback(bound_host)

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                status, message = refusal
                body = json.dumps({"error": message}).encode()
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: dict) -> tuple[int, str] | None:
        """``(status, reason)`` for a request to refuse, ``None`` to let it through."""
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1").lower()
            if key in headers and key in ("host", "origin", "authorization"):
                return 400, f"more than one {key} header"
            headers[key] = value.decode("latin-1")
        host = _hostname(headers.get("host", ""))
        if host not in self.hosts:
            return 403, "Host is not this node's API address (DNS rebinding?)"
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/").lower() not in self.own_origins(scope) | self.origins:
            return 403, "cross-origin requests are refused"
        if headers.get("sec-fetch-site") == "cross-site" and origin is None:
            return 403, "cross-site requests are refused"
        if scope["method"] not in SAFE_METHODS or self.reads_need_token:
            if scope["method"] == "OPTIONS" and origin is not None and self.origins:
                return None  # a configured origin's CORS preflight (it carries no credentials)
            scheme, _, given = headers.get("authorization", "").strip().partition(" ")
            # RFC 7235: the scheme is case-insensitive (`bearer` is as good as `Bearer`)
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
                return 401, "this request needs the node's API token (Authorization: Bearer, from <data dir>/api.token)"
        return None

    def own_origins(self, scope: dict) -> frozenset[str]:
        port = scope["server"][1] if scope.get("server") else None
        suffix = f":{port}" if port else ""
        return frozenset(f"http://{h if ':' not in h else '[' + h + ']'}{suffix}" for h in self.hosts)


async def serve_api(host: str, port: int, app: Asgi, *, what: str = "the API",
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``host:port`` until cancelled; reports the bound port through
    ``task_status``. A port in use is an :class:`ApiBindError` with one line to show, naming
    ``what`` is served."""
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = _server_log
    config.read_timeout = None  # see REQUEST_TIMEOUT_S
    config.h11_max_incomplete_size = MAX_REQUEST_HEAD
    config.keep_alive_timeout = REQUEST_TIMEOUT_S
    config.include_server_header = False
    try:
        sockets = config.create_sockets()
    except OSError as exc:
        raise ApiBindError(f"cannot serve {what} on {host}:{port}: {exc.strerror or exc}") from None
    bound = sockets.insecure_sockets[0].getsockname()[1]
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(worker_serve, wrap_app(app, config.wsgi_max_body_size, "asgi"), config,
                                    sockets=sockets))
        task_status.started(bound)
