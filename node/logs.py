"""Structured logs: one line per event, ``time level logger key=value…`` or JSON lines."""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import time
from pathlib import Path

from open1b.protocol import Open1bError


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
                 "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


LOG_FILE_BYTES = 10 << 20
LOG_FILE_KEEP = 5


def setup_logging(level: str = "info", *, json_lines: bool = False, prefix: str = "", file: Path | None = None) -> None:
    """Log to stderr, or to ``file`` rotated at 10 MiB with 5 old files kept (``file.1`` …)."""
    handler: logging.Handler
    if file is not None:
        try:
            handler = logging.handlers.RotatingFileHandler(file, maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_KEEP)
        except OSError as exc:
            raise Open1bError(f"cannot write the log file {file}: {exc.strerror}") from None
    else:
        handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(_JsonFormatter())
    else:
        formatter = logging.Formatter(f"%(asctime)s.%(msecs)03d {prefix}%(levelname)s %(name)s: %(message)s",
                                      datefmt="%H:%M:%S")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    # py-libp2p logs a WARNING for every normally closed DHT stream and chatty INFO lines from
    # loggers it configures itself; only its errors are worth an operator's attention.
    handler.addFilter(lambda r: not r.name.startswith("libp2p") or r.levelno >= logging.ERROR)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    libp2p = logging.getLogger("libp2p")
    libp2p.handlers[:] = []
    libp2p.propagate = True
