"""The local API's guard (node/api.py) in one process, and the real daemon's API behind it:
forged Host and Origin headers, missing and wrong tokens, cross-site form POSTs, typed query
validation, and the OpenAPI document in docs/."""

import http.client
import os
import socket
import stat
from pathlib import Path

import pytest
import trio
from fastapi import FastAPI

from open1b.node.api import ApiBindError, ApiGuard, serve_api
from open1b.node.client import ApiUnavailable, call
from open1b.node.datadir import TOKEN_FILE, DataDirError, api_token, init_data_dir, read_api_token

TOKEN = "ab" * 32
EVIL = "http://evil.example"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
OPENAPI_DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def request(api: str, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    """(status, headers, body) of one raw request; ``headers`` may forge Host."""
    host, port = api.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.putrequest(method, path, skip_host="Host" in (headers or {}), skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _toy_app(acted: list) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/read")
    async def read() -> dict:
        return {"ok": True}

    @app.post("/v1/act")
    async def act() -> dict:
        acted.append(1)
        return {"acted": True}

    return app


async def _with_guard(check, *, bound="127.0.0.1", origins=()):
    acted: list = []
    guarded = ApiGuard(_toy_app(acted), token=TOKEN, bound_host=bound, origins=origins)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_api, "127.0.0.1", 0, guarded)
        await trio.to_thread.run_sync(check, f"127.0.0.1:{port}", acted)
        nursery.cancel_scope.cancel()


def test_reads_pass_on_loopback_and_writes_need_the_token():
    def check(api, acted):
        assert call(api, "/v1/read") == {"ok": True}
        for token in (None, "", "cd" * 32, TOKEN[:-1]):
            with pytest.raises(ApiUnavailable, match="HTTP 401"):
                call(api, "/v1/act", method="POST", token=token)
        status, _, _ = request(api, "POST", "/v1/act", {"Authorization": f"Basic {TOKEN}"})
        assert status == 401 and acted == []
        assert call(api, "/v1/act", method="POST", token=TOKEN) == {"acted": True} and acted == [1]

    trio.run(_with_guard, check)


def test_forged_host_and_origin_and_cross_site_forms_are_refused():
    def check(api, acted):
        port = api.rsplit(":", 1)[1]
        auth = {"Authorization": f"Bearer {TOKEN}"}
        # DNS rebinding: the browser sends the attacker's name as Host, even with a loopback IP
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", ""):
            assert request(api, "GET", "/v1/read", {"Host": host})[0] == 403, host
        assert request(api, "GET", "/v1/read", {"Host": "localhost"})[0] == 200
        assert request(api, "GET", "/v1/read", {"Host": f"[::1]:{port}"})[0] == 200
        # CSRF: a form on another origin, with and without a (stolen) token; and a read from there
        for origin in (EVIL, "null", f"http://127.0.0.1:{int(port) + 1}", f"http://localhost.evil.example:{port}"):
            assert request(api, "POST", "/v1/act", {"Origin": origin, **FORM}, b"a=1")[0] == 403, origin
            assert request(api, "POST", "/v1/act", {"Origin": origin, **auth, **FORM}, b"a=1")[0] == 403, origin
            assert request(api, "GET", "/v1/read", {"Origin": origin})[0] == 403, origin
        assert request(api, "POST", "/v1/act", {"Sec-Fetch-Site": "cross-site", **auth})[0] == 403
        assert acted == []
        # the API's own page may act (with the token), and nothing gets CORS headers
        status, headers, _ = request(api, "POST", "/v1/act", {"Origin": f"http://127.0.0.1:{port}", **auth})
        assert status == 200 and acted == [1]
        assert not any(h.startswith("access-control-") for h in headers)
        status, headers, _ = request(api, "OPTIONS", "/v1/act", {"Origin": EVIL, "Access-Control-Request-Method": "POST"})
        assert status == 403 and not any(h.startswith("access-control-") for h in headers)

    trio.run(_with_guard, check)


def test_a_duplicated_host_header_is_refused():
    def check(api, acted):
        host, port = api.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(f"GET /v1/read HTTP/1.1\r\nHost: {api}\r\nHost: evil.example\r\n\r\n".encode())
            assert s.recv(100).split(b"\r\n")[0].split(b" ")[1] in (b"400", b"403")

    trio.run(_with_guard, check)


def test_an_oversized_request_head_is_refused_and_the_server_keeps_serving():
    def check(api, acted):
        host, port = api.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(f"GET /v1/read HTTP/1.1\r\nHost: {api}\r\nX: ".encode() + b"a" * 200_000 + b"\r\n\r\n")
            assert s.recv(100).split(b"\r\n")[0].split(b" ")[1] in (b"400", b"431")
        assert call(api, "/v1/read") == {"ok": True}

    trio.run(_with_guard, check)


def test_configured_origins_get_cors_and_everything_needs_a_token_off_loopback():
    guard = ApiGuard(_toy_app([]), token=TOKEN, bound_host="192.0.2.7", origins=("https://dash.example",))
    scope = {"type": "http", "method": "GET", "server": ("192.0.2.7", 5701)}

    def refusal(**headers):
        return guard.refusal({**scope, "headers": [(k.encode(), v.encode()) for k, v in headers.items()]})

    assert refusal(host="192.0.2.7:5701")[0] == 401  # reads need the token off loopback
    assert refusal(host="192.0.2.7:5701", authorization=f"Bearer {TOKEN}") is None
    for scheme in ("bearer", "BEARER", "beaRer"):  # RFC 7235: the scheme is case-insensitive
        assert refusal(host="192.0.2.7:5701", authorization=f"{scheme} {TOKEN}") is None
    for wrong in (f"Basic {TOKEN}", f"Bearer{TOKEN}", "Bearer", f"Bearer {TOKEN}x", f"Bearer  {TOKEN[:-1]}"):
        assert refusal(host="192.0.2.7:5701", authorization=wrong)[0] == 401, wrong
    assert refusal(host="192.0.2.7", origin="https://dash.example", authorization=f"Bearer {TOKEN}") is None
    assert refusal(host="192.0.2.7", origin=EVIL, authorization=f"Bearer {TOKEN}")[0] == 403
    assert refusal(host="198.51.100.1", authorization=f"Bearer {TOKEN}")[0] == 403

    def check(api, acted):
        status, headers, _ = request(api, "GET", "/v1/read", {"Origin": "https://dash.example"})
        assert status == 200 and headers.get("access-control-allow-origin") == "https://dash.example"

    from open1b.node.api_routes import cors  # the daemon's CORS wiring, on the toy app
    acted: list = []

    async def serve():
        app = _toy_app(acted)
        cors(app, ("https://dash.example",))
        guarded = ApiGuard(app, token=TOKEN, bound_host="127.0.0.1", origins=("https://dash.example",))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_api, "127.0.0.1", 0, guarded)
            await trio.to_thread.run_sync(check, f"127.0.0.1:{port}", acted)
            nursery.cancel_scope.cancel()

    trio.run(serve)


def test_a_port_in_use_is_one_line():
    async def main():
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            with pytest.raises(ApiBindError, match=f"cannot serve the API on 127.0.0.1:{taken.getsockname()[1]}: "
                                                   "Address already in use$"):
                await serve_api("127.0.0.1", taken.getsockname()[1], _toy_app([]))

    trio.run(main)


def test_the_token_is_created_at_init_0600_and_never_overwritten(tmp_path):
    init_data_dir(tmp_path / "d")
    path = tmp_path / "d" / TOKEN_FILE
    token = read_api_token(tmp_path / "d")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) == 64
    assert api_token(tmp_path / "d") == token and init_data_dir(tmp_path / "d") and read_api_token(tmp_path / "d") == token
    assert init_data_dir(tmp_path / "e") and read_api_token(tmp_path / "e") != token  # each data dir its own
    path.write_text("not a token\n")
    with pytest.raises(DataDirError, match="does not hold an API token"):
        read_api_token(tmp_path / "d")
    path.unlink()
    os.symlink(tmp_path / "e" / TOKEN_FILE, path)  # a link planted in place of the token is not followed
    with pytest.raises(DataDirError):
        read_api_token(tmp_path / "d")
    with pytest.raises(DataDirError):
        api_token(tmp_path / "d")
