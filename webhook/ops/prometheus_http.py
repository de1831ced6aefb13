"""Prometheus's HTTP API, the transport every reader of Prometheus shares (``pool recommend``'s demand history,
``audit``'s GPU metrics).

urllib3 (which the kubernetes client brings, and which ``ops`` may import) with what kubectl users expect of a
server's credentials: a bearer token (``--token``, or a file: ``--token-file``, e.g. a ServiceAccount's), a CA
bundle (``--certificate-authority``), or ``--insecure-skip-tls-verify``. Errors are ``PrometheusError``: what
failed, against which URL.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import urllib3

TIMEOUT = urllib3.Timeout(connect=10.0, read=120.0)  # a 14-day range of a busy server takes a while


class PrometheusError(Exception):
    """Prometheus could not be read: unreachable, refused, or an answer that is not one."""


@dataclass(frozen=True)
class Server:
    url: str
    token: str | None = None
    ca_file: str | None = None
    insecure: bool = False


def pool_for(server: Server) -> urllib3.PoolManager:
    if server.url.startswith("https://"):
        if server.insecure:
            return urllib3.PoolManager(cert_reqs="CERT_NONE", timeout=TIMEOUT, retries=False)
        return urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=server.ca_file, timeout=TIMEOUT, retries=False)
    return urllib3.PoolManager(timeout=TIMEOUT, retries=False)


def get(pool: urllib3.PoolManager, server: Server, path: str, fields: Mapping[str, str]) -> Any:
    """``GET path?fields``: the answer's ``data``, or ``PrometheusError``."""
    url = server.url.rstrip("/") + path + "?" + urllib.parse.urlencode(fields)
    headers = {"Accept": "application/json"}
    if server.token:
        headers["Authorization"] = f"Bearer {server.token}"
    try:
        response = pool.request("GET", url, headers=headers)
    except urllib3.exceptions.SSLError as err:
        raise PrometheusError(
            f"{server.url}: TLS: {err} (--certificate-authority FILE, or --insecure-skip-tls-verify)"
        ) from err
    except urllib3.exceptions.HTTPError as err:
        raise PrometheusError(f"cannot reach Prometheus at {server.url}: {err}") from err
    try:
        body = json.loads(response.data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        body = None
    if response.status in (401, 403):
        raise PrometheusError(f"{server.url}: HTTP {response.status}: give a bearer token (--token or --token-file)")
    if not isinstance(body, dict) or body.get("status") != "success":
        reason = body.get("error") if isinstance(body, dict) else response.data[:200].decode("utf-8", "replace")
        raise PrometheusError(f"{server.url}{path}: HTTP {response.status}: {reason}")
    return body.get("data")


def query_range(server: Server, query: str, start: float, end: float, step: float) -> list[Mapping[str, Any]]:
    """One ``query_range``: its matrix's series (``metric``, ``values``)."""
    return query_ranges(server, [query], start, end, step)[0]


def query_ranges(
    server: Server, queries: list[str], start: float, end: float, step: float
) -> list[list[Mapping[str, Any]]]:
    """Several ``query_range`` over one connection pool, in order."""
    pool = pool_for(server)
    answers = []
    try:
        for query in queries:
            data = get(
                pool,
                server,
                "/api/v1/query_range",
                {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
            )
            if (
                not isinstance(data, dict)
                or data.get("resultType") != "matrix"
                or not isinstance(data.get("result"), list)
            ):
                raise PrometheusError(f"{server.url}: query_range answered no matrix for {query}")
            answers.append(data["result"])
    finally:
        pool.clear()
    return answers
