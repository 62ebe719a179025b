"""Talking to a running daemon's local API (used by the CLI and the devnet)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from open1b.protocol import Open1bError


class ApiUnavailable(Open1bError):
    """The daemon's API could not be reached or answered with an error."""


def call(api: str, path: str, *, method: str = "GET", timeout: float = 10.0) -> Any:
    """``api`` is ``HOST:PORT``; returns the decoded JSON body or raises :class:`ApiUnavailable`."""
    request = urllib.request.Request(f"http://{api}{path}", method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", "")
        except ValueError:
            detail = ""
        raise ApiUnavailable(f"{api}{path}: HTTP {exc.code} {detail}".strip()) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ApiUnavailable(f"cannot reach the node API at {api}: {exc}") from exc
