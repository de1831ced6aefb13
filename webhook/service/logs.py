"""JSON logging: every log record as one JSON line; which reviews get a line of their own.

At the default level (``info``) a review gets a line only when someone may have to act on it: a
denial, an internal error, or a policy violation found in ``warn`` or ``audit`` mode (what
``enforce`` would deny). Allowed and patched reviews are logged at ``debug`` (one info line per
review took 12% of the server's CPU in a profile, docs/benchmarks.md); a summary line every
``--log-summary-seconds`` counts the reviews of each decision instead. The apiserver's audit log
has every review's ``auditAnnotations`` anyway.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

REVIEW_LOGGER = "webhook.review"
DEFAULT_SUMMARY_SECONDS = 60.0  # how often the summary line of reviews is written

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "msg", ...extra fields}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_") and key != "color_message":
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def configure(level: str = "info") -> None:
    """Send every log record (ours and uvicorn's) to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


def uvicorn_log_config(level: str = "info") -> dict[str, Any]:
    """A logging dictConfig for uvicorn (also applied in each worker process) that writes JSON lines."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "webhook.service.logs.JsonFormatter"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            "uvicorn": {"handlers": [], "propagate": True},
            "uvicorn.error": {"handlers": [], "propagate": True},
            # Access lines duplicate the review line and cost time per request.
            "uvicorn.access": {"handlers": [], "propagate": False, "level": "WARNING"},
        },
    }


_review_log = logging.getLogger(REVIEW_LOGGER)


def review_log_level(decision: str, violations: tuple[str, ...]) -> int | None:
    """``info`` for what an operator may act on (denied, error, any violation), else ``debug``;
    None when the configured level drops that line (checked before its fields are built)."""
    level = logging.INFO if violations or decision in ("denied", "error") else logging.DEBUG
    return level if _review_log.isEnabledFor(level) else None


def log_review(level: int, fields: dict[str, Any]) -> None:
    """The line of one review: uid, namespace, pod, operation, class, decision, rule, patch ops, latency."""
    _review_log.log(level, "admission review", extra=fields)


class ReviewCounts:
    """Reviews answered since the last summary line, by decision (one worker process)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.since = time.monotonic()

    def add(self, decision: str) -> None:
        counts = self.counts
        counts[decision] = counts.get(decision, 0) + 1

    def log_summary(self) -> None:
        """One ``info`` line with the counts since the last one (nothing when there were no reviews)."""
        counts, self.counts = self.counts, {}
        now = time.monotonic()
        seconds, self.since = now - self.since, now
        if counts:
            _review_log.info(
                "admission reviews",
                extra={"period_seconds": round(seconds, 1), "reviews": sum(counts.values()), "decisions": counts},
            )
