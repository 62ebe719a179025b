import socket

import trio

from open1b.node.api import ApiError, Route, serve_api
from open1b.node.client import ApiUnavailable, call


async def _with_server(check):
    async def hello(path, query):
        return {"path": path, "query": query}

    async def boom(path, query):
        raise RuntimeError("bug")

    async def not_found(path, query):
        raise ApiError(404, "nothing here")

    routes = [Route("GET", "/v1/hello", hello), Route("GET", "/v1/boom", boom),
              Route("GET", "/v1/missing", not_found), Route("POST", "/v1/act", hello)]
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_api, "127.0.0.1", 0, routes)
        await trio.to_thread.run_sync(check, f"127.0.0.1:{port}")
        nursery.cancel_scope.cancel()


def _expect_error(api, path, text, method="GET"):
    try:
        call(api, path, method=method)
    except ApiUnavailable as exc:
        assert text in str(exc), exc
    else:
        raise AssertionError(f"{path} should have failed")


def test_routes_errors_and_resilience():
    def check(api):
        assert call(api, "/v1/hello/a/b?x=1") == {"path": ["a", "b"], "query": {"x": "1"}}
        _expect_error(api, "/v1/boom", "HTTP 500")
        _expect_error(api, "/v1/missing", "HTTP 404 nothing here")
        _expect_error(api, "/v1/nope", "HTTP 404")
        _expect_error(api, "/v1/act", "HTTP 405")
        assert call(api, "/v1/act", method="POST") == {"path": [], "query": {}}
        # a request head larger than the limit is refused, and the server keeps serving
        host, port = api.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"GET /v1/hello HTTP/1.1\r\n" + b"X: " + b"a" * 20000 + b"\r\n\r\n")
            assert b"400" in s.recv(1000).split(b"\r\n")[0]
        assert call(api, "/v1/hello")["path"] == []

    trio.run(_with_server, check)


def test_unreachable_api_is_a_typed_error():
    _expect_error("127.0.0.1:1", "/v1/status", "cannot reach")
