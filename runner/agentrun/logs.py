"""Process-wide log setup shared by the runner pod, the operator and the CLI: text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from typing_extensions import override

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Context a record may carry as attributes; a JSON line has them as fields of their own.
RECORD_FIELDS = ("thread_id", "attempt")


class JsonFormatter(logging.Formatter):
    """One JSON object per log record (``AGENTRUN_LOG_FORMAT=json``), the run's thread and attempt as fields."""

    @override
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in RECORD_FIELDS:  # set by the run logger (agentrun.context.RunLogger)
            if (value := getattr(record, field, None)) is not None:
                entry[field] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    """Log to stderr as text or JSON (``fmt``) at ``level``, replacing any handler set before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
