"""JSON-lines logging: one object per line with node, check, status and message when known."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

EXTRA_KEYS = ("node", "check", "status", "severity", "tier", "event", "durationMs", "error")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in EXTRA_KEYS:
            value = getattr(record, key, None)
            if value is not None:
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The Kubernetes client logs every retry at WARNING with tracebacks: keep our own lines readable.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
