"""Scenario 8: the serving certificate is renewed (the project's ``certs`` command, same CA) and the
policy file is changed while the apiserver keeps calling the webhook. No call fails: every pod the
apiserver admitted meanwhile carries the webhook's own mutations (with failurePolicy Ignore a failed
call would admit the pod silently, without them), and the apiserver's own counters of failed webhook
calls stay at 0."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import yaml
from cryptography import x509

from webhook.core.policy import default_policy_text

from .controlplane import LOOPBACK
from .harness import Cluster, cli, gpu_pod, metric_value
from .kube import ApiError, Kube, Obj, wait_until

WEBHOOK = "pods.rocm-isolation.io"
NEW_VARIABLE = "GPU_MAX_HW_QUEUES"


def _env(pod: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


class Load:
    """Threads creating (dry-run) GPU pods through the apiserver for as long as the test runs."""

    def __init__(self, kube: Kube, namespace: str, threads: int = 2) -> None:
        self.kube, self.namespace = kube, namespace
        self.stop = threading.Event()
        self.results: list[Obj] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, index: int) -> None:
        # Each thread its own client: its own keep-alive connection to the apiserver.
        kube = Kube(self.kube.host, self.kube.port, self.kube.context)
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                pod = kube.create(gpu_pod(f"load-{index}-{n}", self.namespace), dry_run=True)
            except (ApiError, OSError) as err:
                with self.lock:
                    self.errors.append(str(err))
                continue
            with self.lock:
                self.results.append(pod)

    def count(self) -> int:
        with self.lock:
            return len(self.results)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def _served_serial(port: int, ca_file: str) -> int:
    context = ssl.create_default_context(cafile=ca_file)
    with (
        socket.create_connection((LOOPBACK, port), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname=LOOPBACK) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _apiserver_failures(cluster: Cluster) -> tuple[float, float]:
    text = cluster.kube.metrics()
    rejected = metric_value(
        text, "apiserver_admission_webhook_rejection_count", name=WEBHOOK, error_type="calling_webhook_error"
    )
    failed_open = metric_value(text, "apiserver_admission_webhook_fail_open_count", name=WEBHOOK)
    return rejected, failed_open


@pytest.fixture
def policy_restored(cluster: Cluster) -> Iterator[None]:
    original = cluster.webhook.policy_file.read_text(encoding="utf-8")
    yield
    if cluster.webhook.policy_file.read_text(encoding="utf-8") == original:
        return
    reloads = cluster.webhook.metric("rocm_isolation_policy_reloads_total")
    cluster.webhook.policy_file.write_text(original, encoding="utf-8")
    wait_until(
        lambda: cluster.webhook.metric("rocm_isolation_policy_reloads_total") > reloads,
        timeout=60,
        what="the original policy reloaded",
    )


def test_certificate_rotation_and_policy_reload_while_the_apiserver_calls(
    cluster: Cluster, namespace: Callable[..., str], policy_restored: None
) -> None:
    ns = namespace(labels={"rocm-isolation.io/class": "training"})
    webhook = cluster.webhook
    assert _apiserver_failures(cluster) == (0, 0)
    old_serial = _served_serial(webhook.port, str(webhook.ca_file))
    cert_reloads = webhook.metric("rocm_isolation_certificate_reloads_total")
    policy_reloads = webhook.metric("rocm_isolation_policy_reloads_total")

    with Load(cluster.kube, ns) as load:
        wait_until(lambda: load.count() >= 20, timeout=60, what="load through the apiserver")

        # Renewal: the project's command re-issues the serving pair with the CA already in the directory.
        cli("certs", "--out-dir", str(webhook.cert_dir), check=True)
        wait_until(
            lambda: webhook.metric("rocm_isolation_certificate_reloads_total") > cert_reloads,
            timeout=60,
            what="the renewed certificate to be loaded",
        )
        assert _served_serial(webhook.port, str(webhook.ca_file)) != old_serial
        mark = load.count()
        wait_until(lambda: load.count() >= mark + 20, timeout=60, what="load after the renewal")

        # Policy change: training pods get one more variable.
        policy = yaml.safe_load(default_policy_text())
        policy["spec"]["classes"]["training"]["env"].append({"name": NEW_VARIABLE, "value": "2", "onConflict": "keep"})
        webhook.policy_file.write_text(yaml.safe_dump(policy), encoding="utf-8")
        wait_until(
            lambda: webhook.metric("rocm_isolation_policy_reloads_total") > policy_reloads,
            timeout=60,
            what="the changed policy to be loaded",
        )
        mark = load.count()
        wait_until(
            lambda: any(NEW_VARIABLE in _env(p) for p in load.results[mark:]),
            timeout=60,
            what="pods with the new policy's variable",
        )
        time.sleep(1)  # a little more load on the new policy and the new certificate

    assert load.errors == [], load.errors[:5]
    assert len(load.results) >= 60
    for pod in load.results:
        annotations = pod["metadata"].get("annotations") or {}
        # Written by the webhook only (not by the placement policy): the call happened and succeeded.
        assert "rocm-isolation.io/mutations" in annotations, pod["metadata"]["name"]
        assert _env(pod)["HSA_QUEUE_PRIORITY"] == "low"
    with_new = [p for p in load.results if NEW_VARIABLE in _env(p)]
    assert with_new and load.results[-1] in with_new  # the last pods were decided by the new policy
    assert _apiserver_failures(cluster) == (0, 0)
    assert webhook.metric("rocm_isolation_errors_total", kind="internal") == 0
