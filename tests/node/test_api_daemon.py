"""A real daemon's API (issue 16): what a web page elsewhere sends is refused and the daemon keeps
running; typed queries answer 422, never 500; the OpenAPI document in docs/ is the routes'."""

import http.client
import json
import os
import socket
from pathlib import Path

import pytest

from open1b.devnet import Daemons
from open1b.node.client import ApiUnavailable, call
from open1b.node.datadir import read_api_token

from .commands import cli
from .test_api import EVIL, FORM, OPENAPI_DOC, request

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("api")
    daemons = Daemons(workdir, workdir, redundancy=1)
    daemons.plan(1)
    daemons.start(0, audit=False, bootstrap=[])
    try:
        yield daemons
    finally:
        daemons.stop()


def test_forged_origin_host_and_tokenless_shutdowns_do_not_stop_the_daemon(node):
    api, proc = node.api(0), node.procs[0]
    port = api.rsplit(":", 1)[1]
    token = read_api_token(node.dirs[0])
    attempts = [
        {"Origin": EVIL, **FORM},  # a cross-site form POST, as the issue found it
        {"Origin": EVIL, **FORM, "Authorization": f"Bearer {token}"},  # even with the token
        {"Host": f"evil.example:{port}", "Authorization": f"Bearer {token}"},  # DNS rebinding
        {},  # no token
        {"Authorization": "Bearer " + "0" * 64},  # a wrong one
    ]
    for headers in attempts:
        status, _, body = request(api, "POST", "/v1/shutdown", headers, b"x=1")
        assert status in (401, 403) and "error" in json.loads(body), (headers, status)
    assert proc.poll() is None and call(api, "/v1/status")["peer_id"] == node.peer_id(0)
    # a page on another origin cannot read the answers either
    assert request(api, "GET", "/v1/status", {"Origin": EVIL})[0] == 403
    assert request(api, "GET", "/v1/status", {"Host": f"evil.example:{port}"})[0] == 403


def test_queries_are_typed_and_bounded(node):
    api = node.api(0)
    for path in ("/v1/attestations/ab?step=" + "9" * 40, "/v1/attestations/ab?step=-1", "/v1/coverage/ab?redundancy=0",
                 "/v1/coverage/ab?redundancy=x", "/v1/evidence/ab?step=1e9", "/v1/evidence/ab", "/v1/coverage/zz",
                 "/v1/spotchecks/zz", "/v1/spotchecks/ab?step=" + "9" * 40, "/v1/spotchecks/ab?step=-1", "/v1/disputes/zz"):
        status, _, body = request(api, "GET", path)
        assert status == 422 and json.loads(body)["error"], (path, status, body)
    assert request(api, "GET", "/v1/coverage/ab?redundancy=2")[0] == 404  # valid, but no such run
    status, _, body = request(api, "GET", "/v1/nope")
    assert status == 404 and json.loads(body)["error"]
    with pytest.raises(ApiUnavailable, match="HTTP 405"):
        call(api, "/v1/shutdown")


def test_every_route_from_the_openapi_document_types_its_path_and_every_write_needs_the_token(node):
    """The hostile sweep, over every route the daemon serves (a route added later is swept too):
    malformed, oversized and encoded path parameters answer 422 or 404, never 500; no request
    other than GET/HEAD acts without the token, whatever its path; the daemon keeps serving."""
    api, token = node.api(0), read_api_token(node.dirs[0])
    served = call(api, "/v1/openapi.json")
    params = {"run": ("zz", "0" * 65, "%00", "a" * 5000, "..%2F..%2Fetc"), "digest": ("zz", "0" * 63, "g" * 64, "0" * 65)}
    for path, ops in served["paths"].items():
        names = [n.strip("{}") for n in path.split("/") if n.startswith("{")]
        paths = [path.replace("{run}", "ab").replace("{digest}", "0" * 64)]
        paths += [paths[0].replace("/ab", "/" + bad, 1) for bad in params["run"] if "run" in names]
        paths += [path.replace("{run}", "ab").replace("{digest}", bad) for bad in params["digest"] if "digest" in names]
        for method in ops:
            if method == "get" and path == "/v1/events":
                continue  # a stream: test_events_stream_says_what_changed
            for target in paths:
                status, _, body = request(api, method.upper(), target)
                if method in ("get", "head"):
                    assert status in (200, 404, 422) and (status == 200 or json.loads(body)["error"]), (target, status)
                    continue
                assert status == 401, (method, target, status)
                if target != paths[0]:  # a malformed parameter, with the token: refused before the route acts
                    status, _, body = request(api, method.upper(), target, {"Authorization": f"Bearer {token}"})
                    assert status in (404, 422) and json.loads(body)["error"], (method, target, status)
    assert node.procs[0].poll() is None and call(api, "/v1/status")["peer_id"] == node.peer_id(0)


def test_the_openapi_document_in_docs_is_the_routes(node):
    served = call(node.api(0), "/v1/openapi.json")
    if os.environ.get("OPEN1B_WRITE_OPENAPI"):  # after changing a route: regenerate, then review the diff
        OPENAPI_DOC.write_text(json.dumps(served, indent=1, sort_keys=True) + "\n")
    assert json.loads(OPENAPI_DOC.read_text()) == served, "docs/openapi.json is stale: rerun with OPEN1B_WRITE_OPENAPI=1"
    routes = {(m.upper(), p) for p, ops in served["paths"].items() for m in ops}
    assert ("POST", "/v1/shutdown") in routes and ("GET", "/v1/coverage/{run}") in routes
    # every route the CLI calls is in it
    cli_source = (Path(__file__).resolve().parents[2] / "node" / "cli.py").read_text()
    for prefix in ("/v1/status", "/v1/peers", "/v1/runs", "/v1/coverage/", "/v1/claims", "/v1/attestations/",
                   "/v1/fetch/", "/v1/reveal/"):
        assert f'"{prefix}' in cli_source or f'f"{prefix}' in cli_source
        assert any(p == prefix.rstrip("/") or p.startswith(prefix) for _, p in routes), prefix


def test_the_page_is_served_with_a_strict_policy(node):
    status, headers, body = request(node.api(0), "GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html") and b"<canvas" in body
    assert "frame-ancestors 'none'" in headers["content-security-policy"] and "default-src 'none'" in \
        headers["content-security-policy"]


def test_the_api_port_in_use_is_a_one_line_error(node, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, out, err = cli("daemon", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--no-audit",
                           "--api", f"127.0.0.1:{port}", timeout=120)
    assert rc == 1 and err.strip().splitlines()[-1] == (
        f"open1b-node: error: cannot serve the API on 127.0.0.1:{port}: Address already in use"), err


def test_events_stream_says_what_changed(node):
    host, port = node.api(0).rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/v1/events")
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
        lines = [response.readline() for _ in range(3)]
    finally:
        conn.close()
    assert lines == [b"event: change\n", b"data: 0 attestations, 0 runs, 0 peers\n", b"\n"], lines


def test_the_event_stream_stays_open_past_the_request_timeout(node):
    """Hypercorn's read timeout ended the page's event stream every 5 s (the page said
    "disconnected" 40 % of the time): the stream now outlives it, and says so with comments."""
    import time

    from open1b.node.api import REQUEST_TIMEOUT_S
    from open1b.node.api_routes import EVENTS_KEEPALIVE_S

    host, port = node.api(0).rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=EVENTS_KEEPALIVE_S * 3)
    try:
        conn.request("GET", "/v1/events")
        response = conn.getresponse()
        assert [response.readline() for _ in range(3)][0] == b"event: change\n"
        started = time.monotonic()
        lines = [response.readline(), response.readline()]  # nothing changes on this node: a keep-alive
        assert lines == [b": keep-alive\n", b"\n"] and time.monotonic() - started > REQUEST_TIMEOUT_S, lines
    finally:
        conn.close()


def test_a_request_head_that_trickles_in_is_cut_off(node):
    """With Hypercorn's read timeout off, a client sending its head a byte at a time must still not
    hold a connection for ever (slowloris)."""
    import time

    from open1b.node.api import REQUEST_TIMEOUT_S

    host, port = node.api(0).rsplit(":", 1)
    head = f"GET /v1/status HTTP/1.1\r\nHost: {host}:{port}\r\nX-Slow: {'a' * 100}".encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        started = time.monotonic()
        closed = False
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            sock.settimeout(0.25)
            try:
                closed = sock.recv(4096) == b""
            except socket.timeout:
                continue
            break
    assert closed and time.monotonic() - started < 4 * REQUEST_TIMEOUT_S
    assert call(node.api(0), "/v1/status")["peer_id"] == node.peer_id(0)


def test_ui_prints_the_pages_url_with_the_token_in_the_fragment(node, tmp_path):
    rc, out, err = cli("ui", "--data-dir", str(node.dirs[0]), "--no-open", "--json")
    assert rc == 0, err
    answer = json.loads(out)
    assert answer == {"url": f"http://{node.api(0)}/#token={read_api_token(node.dirs[0])}", "opened": False}
    # another user's data dir (no readable token): the page's URL alone
    (tmp_path / "other").mkdir()
    rc, out, err = cli("ui", "--data-dir", str(tmp_path / "other"), "--api", node.api(0), "--no-open")
    assert rc == 0 and out.strip() == f"http://{node.api(0)}/", err


def test_the_token_holder_stops_the_daemon(node):
    proc = node.procs[0]
    assert call(node.api(0), "/v1/shutdown", method="POST", token=read_api_token(node.dirs[0])) == {"shutting_down": True}
    assert proc.wait(timeout=30) == 0
