"""Hot reloads under load, on the real server: certificates rotated and the policy replaced by a
broken file while apiserver-like clients stream reviews. Zero reviews may fail.

The clients replay kube-apiserver's side (see kube_apiserver.py): one keeps a pooled connection,
one dials a new connection for every review (as the apiserver does when its pool is empty).
"""

from __future__ import annotations

import shutil
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import PKI, ServerFactory, load_review, wait_for
from kube_apiserver import ApiserverClient, apply_patch, decoded_patch, verify_response

from webhook.service import certs

POLICY = Path(__file__).parents[1] / "fixtures" / "admission" / "policy.yaml"


class Streamer:
    """Posts reviews in a loop until stopped; records every failure."""

    def __init__(self, port: int, ca_file: Path, review: dict[str, Any], *, pooled: bool) -> None:
        self.port, self.ca_file, self.review, self.pooled = port, ca_file, review, pooled
        self.ok = 0
        self.failures: list[str] = []
        self.last_response: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self, client: ApiserverClient) -> None:
        status, reply = client.post_review(self.review)
        if status != 200:
            raise AssertionError(f"HTTP {status}: {reply}")
        self.last_response = verify_response(self.review, reply)

    def _run(self) -> None:
        client = ApiserverClient(self.port, self.ca_file)
        while not self._stop.is_set():
            try:
                if not self.pooled:
                    client.close()
                    client = ApiserverClient(self.port, self.ca_file)
                self._one(client)
                self.ok += 1
            except Exception as err:
                self.failures.append(f"{type(err).__name__}: {err}")
                client.close()
                client = ApiserverClient(self.port, self.ca_file)
        client.close()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


@contextmanager
def streaming(port: int, ca_file: Path, review: dict[str, Any]) -> Iterator[list[Streamer]]:
    streamers = [Streamer(port, ca_file, review, pooled=pooled) for pooled in (True, False)]
    for streamer in streamers:
        streamer.start()
    try:
        wait_for(lambda: all(s.ok > 0 or s.failures for s in streamers), what="streams started")
        yield streamers
    finally:
        for streamer in streamers:
            streamer.stop()


def progress(streamers: list[Streamer], at_least: int) -> Callable[[], bool]:
    marks = [s.ok for s in streamers]
    return lambda: all(s.ok >= m + at_least or s.failures for s, m in zip(streamers, marks, strict=True))


def new_connection_certificate(port: int, ca_file: Path) -> bytes:
    with ApiserverClient(port, ca_file) as client:
        client.request("GET", "/healthz")
        return client.peer_certificate()


def der(cert: certs.Issued) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.cert.public_bytes(serialization.Encoding.DER)


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_certificate_rotation_under_load(running_server: ServerFactory, pki: PKI) -> None:
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file, args=["--cert-poll-seconds", "0.2"])
    original = der(pki.serving)
    assert new_connection_certificate(server.port, pki.ca_file) == original
    review = load_review("training-pod-create.json")
    with streaming(server.port, pki.ca_file, review) as streamers:
        # A broken rewrite first: a certificate that does not match its key is not loaded.
        foreign_key = certs.generate_ca().key_pem()
        (pki.dir / "tls.key").write_bytes(foreign_key)
        wait_for(
            lambda: metric_value(server.metrics(), "rocm_isolation_certificate_reload_failures_total") >= 1,
            what="the broken pair to be rejected",
        )
        assert new_connection_certificate(server.port, pki.ca_file) == original
        status, ready = server.get_json("/readyz")
        assert status == 200 and "lastReloadError" in ready["checks"]["certificates"]
        wait_for(progress(streamers, 5), what="reviews after the broken pair")

        # Then a real renewal, as cert-manager writes it.
        renewed = pki.reissue(days=20)
        wait_for(
            lambda: new_connection_certificate(server.port, pki.ca_file) == der(renewed),
            what="new connections to get the renewed certificate",
        )
        wait_for(progress(streamers, 5), what="reviews after the rotation")
    for streamer in streamers:
        assert streamer.failures == [], streamer.failures
        assert streamer.ok > 10
    status, ready = server.get_json("/readyz")
    assert "lastReloadError" not in ready["checks"]["certificates"]
    assert ready["checks"]["certificates"]["notAfter"].startswith(str(renewed.cert.not_valid_after_utc.date()))
    metrics = server.metrics()
    assert metric_value(metrics, "rocm_isolation_certificate_reloads_total") >= 1
    assert metric_value(metrics, "rocm_isolation_certificate_expiry_timestamp_seconds") == float(
        int(renewed.cert.not_valid_after_utc.timestamp())
    )


def test_rotation_to_a_new_ca_is_seen_by_new_connections(
    running_server: ServerFactory, pki: PKI, tmp_path: Path
) -> None:
    """A renewal under a different CA: clients that trust only the old CA fail, the new CA works."""
    server = running_server(cert_dir=pki.dir, ca_file=pki.ca_file, args=["--cert-poll-seconds", "0.2"])
    new_ca = certs.generate_ca()
    certs.write_certificates(pki.dir, dns_names=certs.service_dns_names(), ca=new_ca)
    new_bundle = tmp_path / "new-ca.crt"
    new_bundle.write_bytes(new_ca.cert_pem())

    def served_by_new_ca() -> bool:
        try:
            new_connection_certificate(server.port, new_bundle)
            return True
        except ssl.SSLError:
            return False

    wait_for(served_by_new_ca, what="the certificate of the new CA")


def _inference_review() -> dict[str, Any]:
    return load_review("inference-pod-create.json")


def _gpu_max_hw_queues(response: dict[str, Any], review: dict[str, Any]) -> str | None:
    pod = apply_patch(review["request"]["object"], response)
    for var in pod["spec"]["containers"][0].get("env", []):
        if var["name"] == "GPU_MAX_HW_QUEUES":
            return str(var["value"])
    return None


def test_broken_policy_keeps_the_last_good_one_under_load(
    running_server: ServerFactory, pki: PKI, tmp_path: Path
) -> None:
    policy_file = tmp_path / "policy.yaml"
    shutil.copy(POLICY, policy_file)
    server = running_server(
        cert_dir=pki.dir, ca_file=pki.ca_file, policy=policy_file, args=["--policy-poll-seconds", "0.2"]
    )
    review = _inference_review()
    with streaming(server.port, pki.ca_file, review) as streamers:
        # Broken YAML, written in place (not atomically), as a careless edit would.
        policy_file.write_text(POLICY.read_text().replace("  classes:\n", "  classes: [\n", 1))
        wait_for(
            lambda: metric_value(server.metrics(), "rocm_isolation_policy_reload_failures_total") >= 1,
            what="the broken policy to be rejected",
        )
        wait_for(progress(streamers, 5), what="reviews after the broken policy")
        status, ready = server.get_json("/readyz")
        assert status == 200
        error = ready["checks"]["policy"]["lastReloadError"]
        assert "line" in error and "column" in error, error
        assert ready["checks"]["policy"]["name"] == "service-tests"
        assert metric_value(server.metrics(), "rocm_isolation_policy_last_reload_success") == 0
        # The old policy is still in force: inference pods still get GPU_MAX_HW_QUEUES=4.
        for streamer in streamers:
            assert streamer.last_response is not None
            assert _gpu_max_hw_queues(streamer.last_response, review) == "4"

        # A schema error (valid YAML) is rejected the same way, naming the field.
        policy_file.write_text(POLICY.read_text().replace("placement: reserved", "placement: anywhere"))
        wait_for(
            lambda: metric_value(server.metrics(), "rocm_isolation_policy_reload_failures_total") >= 2,
            what="the invalid policy to be rejected",
        )
        status, ready = server.get_json("/readyz")
        assert "classes.inference.placement" in ready["checks"]["policy"]["lastReloadError"]

        # A valid new policy is picked up.
        policy_file.write_text(POLICY.read_text().replace('value: "4"', 'value: "6"'))

        def new_policy_in_force() -> bool:
            with ApiserverClient(server.port, pki.ca_file) as client:
                _, reply = client.post_review(review)
            return _gpu_max_hw_queues(verify_response(review, reply), review) == "6"

        wait_for(new_policy_in_force, what="the new policy")
        wait_for(progress(streamers, 5), what="reviews after the new policy")
    for streamer in streamers:
        assert streamer.failures == [], streamer.failures
    status, ready = server.get_json("/readyz")
    assert "lastReloadError" not in ready["checks"]["policy"]
    metrics = server.metrics()
    assert metric_value(metrics, "rocm_isolation_policy_reloads_total") == 1
    assert metric_value(metrics, "rocm_isolation_policy_last_reload_success") == 1
    errors = [line for line in server.log_lines() if line.get("msg", "").startswith("policy reload failed")]
    assert len(errors) == 2
    assert any("line" in problem for problem in errors[0]["problems"])
    assert decoded_patch(streamers[0].last_response or {})
