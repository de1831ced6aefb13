"""``rocm-isolation-webhook manifests``: the renderer (``deploy/render.py``) for the cluster it targets (issue 47).

With ``--kubernetes-version`` (GitOps, offline): for a stock cluster of that minor. Otherwise, when a kubeconfig
is there (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``; never the in-cluster account), for what that
cluster serves: API discovery and the kube-apiserver's feature gates (``cluster/discovery.py``; ``/version`` is no
guide under emulated versions). With neither: the 1.36 manifests, byte for byte what they were before. Each piece
the cluster lacks is said on stderr, one line each, with what holds instead (``deploy/minors.missing``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from webhook.cluster.discovery import discovery, feature_gates
from webhook.cluster.kubeapi import ApiError, KubeApi
from webhook.deploy import minors, render

# Reading the cluster must not hold up rendering for long: (connect, read) seconds per request.
DISCOVERY_TIMEOUT = (5.0, 15.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    render.add_arguments(parser)
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="read what the cluster serves from this kubeconfig's cluster (default: $KUBECONFIG or ~/.kube/config "
        "when there is one; never the in-cluster account); --kubernetes-version renders without reading it",
    )
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")


def read_served(kubeconfig: str | None, context: str | None) -> minors.Served | None:
    """What the kubeconfig's cluster serves; None when there is no kubeconfig. Raises ``ApiError`` when the
    cluster cannot be read."""
    path = kubeconfig or _operator_kubeconfig()
    if path is None:
        return None
    api = KubeApi.connect(path, context=context, timeout=DISCOVERY_TIMEOUT, max_retries=0)
    try:
        return minors.from_cluster(discovery(api, minors.DISCOVERED), feature_gates(api))
    finally:
        api.close()


def _operator_kubeconfig() -> str | None:
    """The operator's kubeconfig (the first of ``$KUBECONFIG``, or ``~/.kube/config``) when there is one: never
    the in-cluster account (a pipeline running in a pod renders for the cluster it names, not the one it runs in)."""
    default = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    first = default.split(os.pathsep)[0]
    return first if first and Path(first).is_file() else None


def main(args: argparse.Namespace) -> int:
    if args.kubernetes_version:
        return render.main(args)
    try:
        served = read_served(args.kubeconfig, args.context)
    except ApiError as err:
        if args.kubeconfig or args.context:
            print(
                f"rocm-isolation-webhook manifests: cannot read what the cluster serves ({err}); pass "
                "--kubernetes-version MINOR to render without it",
                file=sys.stderr,
            )
            return 2
        print(
            f"note: the cluster of the default kubeconfig could not be read ({err}): rendered for Kubernetes "
            f"{minors.DEFAULT}; pass --kubernetes-version MINOR for another",
            file=sys.stderr,
        )
        served = None
    return render.main(args, served=served)
