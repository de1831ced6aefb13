"""The Prometheus HTTP API's transport, shared by what reads Prometheus (``pool recommend``'s demand history).

urllib3 (which the kubernetes client brings, and which ``ops`` may import) with what kubectl users expect of a
server's credentials: a bearer token (``--token``, or a file: ``--token-file``, e.g. a ServiceAccount's), a CA
bundle (``--certificate-authority``), or ``--insecure-skip-tls-verify``; those options are declared here, once
for every command that reads Prometheus (``add_prometheus_options``: ``audit --gpu-metrics``, ``pool recommend``).
Errors are ``PrometheusError``: what failed, against which URL.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import urllib3

TIMEOUT = urllib3.Timeout(connect=10.0, read=120.0)  # a 14-day range of a busy server takes a while
# the destinations of add_prometheus_options's options: Prometheus's credentials
CREDENTIALS = ("token", "token_file", "certificate_authority", "insecure_skip_tls_verify")


def add_prometheus_options(parser: argparse._ActionsContainer, scope: str) -> None:
    """Prometheus's credentials as options (``--token``, ``--token-file``, ``--certificate-authority``,
    ``--insecure-skip-tls-verify``) on ``parser`` (a parser or one of its groups); each help text starts with
    ``scope``, what the options go with (``--gpu-metrics``, ``recommend``)."""
    parser.add_argument("--token", metavar="TOKEN", help=f"{scope}: bearer token for Prometheus")
    parser.add_argument("--token-file", metavar="FILE", help=f"{scope}: read the bearer token from this file")
    parser.add_argument("--certificate-authority", metavar="FILE", help=f"{scope}: CA bundle of Prometheus's TLS")
    parser.add_argument(
        "--insecure-skip-tls-verify",
        action="store_true",
        help=f"{scope}: do not check Prometheus's certificate (insecure)",
    )


class PrometheusError(Exception):
    """Prometheus could not be read: unreachable, refused, or an answer that is not one."""


@dataclass(frozen=True)
class Server:
    url: str
    token: str | None = None
    ca_file: str | None = None
    insecure: bool = False


def connect(server: Server) -> urllib3.PoolManager:
    if server.url.startswith("https://"):
        if server.insecure:
            return urllib3.PoolManager(cert_reqs="CERT_NONE", timeout=TIMEOUT, retries=False)
        return urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=server.ca_file, timeout=TIMEOUT, retries=False)
    return urllib3.PoolManager(timeout=TIMEOUT, retries=False)


def get(pool: urllib3.PoolManager, server: Server, path: str, fields: Mapping[str, str]) -> Any:
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
