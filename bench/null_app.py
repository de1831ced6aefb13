"""The null webhook: the same ``serve`` (uvicorn, TLS, the same app and transport code) with a
handler that answers ``allowed`` without calling the engine.

The app module calls ``webhook.service.app.handle`` for every review that passed the envelope checks; this
module replaces that one function before ``serve`` builds the app, so body reading, JSON decoding,
envelope parsing, response encoding, the logs and the metrics are all the production code. What
the benchmark compares against it is therefore exactly the cost of the policy (handler + engine).

``python -m bench.null_app [serve options]`` takes the options of ``rocm-isolation-webhook serve``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import webhook.service.app
from webhook import cli
from webhook.core import review
from webhook.core.handler import ClusterFacts, Handled
from webhook.core.policy import Policy
from webhook.core.review import AdmissionRequest


def null_handle(request: AdmissionRequest, *, policy: Policy, facts: ClusterFacts) -> Handled:
    """Allow everything, change nothing."""
    return Handled(
        response=review.allowed(), workload_class="", decision="allowed", rule="null-webhook", mode=policy.spec.mode
    )


def main(argv: Sequence[str] | None = None) -> int:
    namespace = vars(webhook.service.app)
    if not callable(namespace.get("handle")):
        raise RuntimeError("webhook.service.app no longer calls a module-level handle(): update bench/null_app.py")
    namespace["handle"] = null_handle
    return cli.main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
