"""Reinvocation for real: a second mutating webhook, called after ours (its configuration's name sorts
after rocm-isolation-webhook), changes every pod, so kube-apiserver reinvokes our webhook
(``reinvocationPolicy: IfNeeded``) on its own output plus that change. The reinvocation must add
nothing: the webhook answers twice, its patch operations counter grows by the first patch only, and
the pod carries each mutation once."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from webhook.core.engine import decide

from .controlplane import LOOPBACK, MINORS
from .harness import Cluster, gpu_pod, live_facts, normalised, unmerged
from .kube import Obj, wait_until

pytestmark = pytest.mark.minors(*MINORS)  # what every stock minor serves (issue 47)

TOUCHED = "e2e.example.com/touched"
CONFIGURATION = "zz-e2e-labeller"


class _Labeller(BaseHTTPRequestHandler):
    """Adds one label to every pod it is sent (a stand-in for any other mutating webhook)."""

    calls = 0

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        pod = request["object"]
        patch: list[Obj] = []
        if TOUCHED not in (pod["metadata"].get("labels") or {}):
            if pod["metadata"].get("labels"):
                patch = [{"op": "add", "path": "/metadata/labels/" + TOUCHED.replace("/", "~1"), "value": "yes"}]
            else:
                patch = [{"op": "add", "path": "/metadata/labels", "value": {TOUCHED: "yes"}}]
        response: Obj = {"uid": request["uid"], "allowed": True}
        if patch:
            response |= {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
        type(self).calls += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def second_webhook(cluster: Cluster, namespace: Callable[..., str]) -> Iterator[str]:
    ns = namespace(labels={"rocm-isolation.io/class": "inference"})
    pair = cluster.plane.pki.issue("labeller", common_name="labeller", ip_addresses=[LOOPBACK], server=True)
    server = ThreadingHTTPServer((LOOPBACK, 0), _Labeller)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pair.cert), str(pair.key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cluster.kube.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION},
            "webhooks": [
                {
                    "name": "labeller.e2e.example.com",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "Never",
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "url": f"https://{LOOPBACK}:{server.server_address[1]}/mutate",
                        "caBundle": base64.b64encode(cluster.plane.pki.ca_file.read_bytes()).decode(),
                    },
                    "rules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                }
            ],
        }
    )
    probe = gpu_pod("probe", ns)
    wait_until(
        lambda: TOUCHED in (cluster.kube.create(copy.deepcopy(probe), dry_run=True)["metadata"].get("labels") or {}),
        timeout=30,
        what="the second webhook in the path",
    )
    try:
        yield ns
    finally:
        cluster.kube.delete("MutatingWebhookConfiguration", CONFIGURATION)
        server.shutdown()
        server.server_close()


def test_the_apiserver_reinvokes_the_webhook_and_the_reinvocation_adds_nothing(
    cluster: Cluster, second_webhook: str
) -> None:
    ns = second_webhook
    webhook = cluster.webhook
    pod = gpu_pod("llm", ns, labels={"app": "llm"})
    # What the webhook's first call receives: the pod as the apiserver makes it before our webhook
    # (read with our configuration deleted), without the later webhook's label.
    with cluster.without_webhook_configuration():
        received = unmerged(normalised(cluster.kube.create(copy.deepcopy(pod), dry_run=True)))
    del received["metadata"]["labels"][TOUCHED]
    first = decide(operation="CREATE", pod=copy.deepcopy(received), **live_facts(cluster, ns))
    assert first.patch, "nothing to do on the first call: the test would prove nothing"

    reviews = webhook.metric("rocm_isolation_admission_reviews_total")
    operations = webhook.metric("rocm_isolation_patch_operations_total")
    labeller_calls = _Labeller.calls
    created = cluster.kube.create(copy.deepcopy(pod), dry_run=True)

    assert _Labeller.calls == labeller_calls + 1
    assert created["metadata"]["labels"][TOUCHED] == "yes"
    # Called twice: once in order, once more because a later webhook changed the pod.
    assert webhook.metric("rocm_isolation_admission_reviews_total") == reviews + 2
    # The first call sent the engine's patch; the reinvocation sent no operation at all.
    assert webhook.metric("rocm_isolation_patch_operations_total") - operations == len(first.patch)
    # Everything once: one reserved-pool requirement per term, one reserved toleration, one spread
    # constraint per topology key, one HSA_QUEUE_PRIORITY.
    terms = created["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    for term in terms:
        assert [e["key"] for e in term["matchExpressions"]].count("rocm-isolation.io/pool") == 1, term
    tolerations = [t for t in created["spec"]["tolerations"] if t.get("key") == "rocm-isolation.io/reserved"]
    assert len(tolerations) == 1, created["spec"]["tolerations"]
    keys = [c["topologyKey"] for c in created["spec"].get("topologySpreadConstraints") or []]
    assert len(keys) == len(set(keys)) and "kubernetes.io/hostname" in keys, keys
    env = [e["name"] for e in created["spec"]["containers"][0].get("env") or []]
    assert env.count("HSA_QUEUE_PRIORITY") == 1, env
    # And the engine on the final pod (what a third call would receive) has nothing left to do.
    assert decide(operation="CREATE", pod=unmerged(normalised(created)), **live_facts(cluster, ns)).patch == ()
