"""Talking to a running daemon's local API (used by the CLI and the devnet)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from open1b.protocol import Open1bError

from .answers import PUBLICATION, MalformedAnswer, Shape, checked
from .config import is_loopback
from .jobs import JobState


class ApiUnavailable(Open1bError):
    """The daemon's API could not be reached or answered with an error."""


def call(api: str, path: str, *, method: str = "GET", timeout: float = 10.0, shape: Shape = None,
         token: str | None = None) -> Any:
    """``api`` is ``HOST:PORT``; returns the decoded JSON body or raises :class:`ApiUnavailable`
    (and, given a ``shape``, :class:`~.answers.MalformedAnswer` for a body of another shape).
    ``token`` (the data dir's ``api.token``) is what mutating routes require, and every route of an
    API off loopback; a read on loopback goes without it, so it is sent no further than needed."""
    if method in ("GET", "HEAD") and is_loopback(api.rpartition(":")[0].strip("[]")):
        token = None
    body = _request(api, path, method, timeout, token)
    return body if shape is None else checked(body, shape, path.split("?")[0])


def _request(api: str, path: str, method: str, timeout: float, token: str | None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://{api}{path}", method=method, data=b"" if method == "POST" else None,
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", "")
        except (ValueError, RecursionError, AttributeError):
            detail = ""
        raise ApiUnavailable(f"{api}{path}: HTTP {exc.code} {detail}".strip()) from exc
    except (urllib.error.URLError, OSError, ValueError, RecursionError) as exc:  # deep JSON: RecursionError
        reason = getattr(exc, "reason", exc)
        raise ApiUnavailable(f"no running daemon answers at {api} (cannot reach the node API: {reason})") from exc
    except http.client.HTTPException as exc:  # something that is not an HTTP server (a libp2p port)
        raise ApiUnavailable(f"{api} did not answer as the node API does ({type(exc).__name__}); "
                             f"is it the daemon's API address (its data dir's api.addr)?") from exc


PUBLISH_POLL_S = 0.2


def publish(api: str, run_dir: Path, update: Callable[[dict], None] = lambda job: None,
            timeout: float = 24 * 3600.0, *, token: str | None, move: bool = False) -> dict:
    """Ask the daemon at ``api`` to publish ``run_dir`` (docs/run-format.md §6) and follow the job
    until it is done (``move``: the daemon renames the files into its blob cache, not copies
    them); ``update`` sees every state. Raises :class:`ApiUnavailable` if the daemon
    refuses the manifest, and :class:`PublishFailed` if a file does not match it or the job makes
    no progress for ``timeout`` seconds (a run of many checkpoints takes long, but never stalls)."""
    from urllib.parse import quote

    # absolute, not resolved: the daemon refuses a run directory that is a symbolic link
    job = call(api, "/v1/publish?dir=" + quote(str(Path(run_dir).absolute())) + ("&move=true" if move else ""),
               method="POST", shape=PUBLICATION, token=token)
    deadline = time.monotonic() + timeout
    while True:
        if job["state"] not in tuple(JobState):
            raise MalformedAnswer(f"malformed answer from the node API: unknown publish state {job['state']!r}")
        update(job)
        if job["state"] == JobState.FAILED:
            raise PublishFailed(f"{job['dir']}: {job['error']}")
        if job["state"] == JobState.DONE:
            return job
        if time.monotonic() > deadline:
            raise PublishFailed(f"{job['dir']}: still {job['state']}, no progress for {timeout:.0f} s")
        time.sleep(PUBLISH_POLL_S)
        before = job
        job = call(api, f"/v1/publications/{job['run']}", shape=PUBLICATION, token=token)
        if job != before:
            deadline = time.monotonic() + timeout


class PublishFailed(Open1bError):
    """The daemon checked the run directory and refused it (or did not finish in time)."""
