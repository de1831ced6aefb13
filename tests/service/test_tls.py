"""The serving TLS context and its reloader, with in-memory handshakes (no sockets)."""

from __future__ import annotations

import ssl
import warnings
from pathlib import Path

import pytest
from conftest import PKI
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kube_apiserver import SERVICE_HOST

from webhook.service import certs
from webhook.service.metrics import Metrics
from webhook.service.tls import CertificateError, CertificateReloader


def handshake(server_context: ssl.SSLContext, ca_file: Path, *, max_version: ssl.TLSVersion | None = None) -> bytes:
    """A TLS handshake through memory BIOs; returns the server certificate (DER) the client saw."""
    client_context = ssl.create_default_context(cafile=str(ca_file))
    if max_version is not None:
        client_context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        client_context.maximum_version = max_version
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context.wrap_bio(c_in, c_out, server_hostname=SERVICE_HOST)
    server = server_context.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side, outgoing, incoming in (("client", client, c_out, s_in), ("server", server, s_out, c_in)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            incoming.write(outgoing.read())
        if all(done.values()):
            cert = client.getpeercert(binary_form=True)
            assert cert is not None
            return cert
    raise AssertionError("handshake did not finish")


def der(issued: certs.Issued) -> bytes:
    return issued.cert.public_bytes(serialization.Encoding.DER)


def test_serves_the_pair_and_reloads_a_new_one(pki: PKI) -> None:
    metrics = Metrics()
    reloader = CertificateReloader(pki.dir, metrics=metrics)
    assert handshake(reloader.context, pki.ca_file) == der(pki.serving)
    assert reloader.check() is False  # unchanged
    renewed = pki.reissue()
    assert reloader.check() is True
    assert handshake(reloader.context, pki.ca_file) == der(renewed)
    assert metrics.registry.get_sample_value("rocm_isolation_certificate_reloads_total") == 1
    assert metrics.registry.get_sample_value("rocm_isolation_certificate_expiry_timestamp_seconds") == int(
        renewed.cert.not_valid_after_utc.timestamp()
    )


@pytest.mark.parametrize("breakage", ["mismatched key", "garbage certificate", "missing key", "truncated certificate"])
def test_a_broken_pair_keeps_the_last_good_one(pki: PKI, breakage: str) -> None:
    metrics = Metrics()
    reloader = CertificateReloader(pki.dir, metrics=metrics)
    cert_file, key_file = pki.dir / "tls.crt", pki.dir / "tls.key"
    if breakage == "mismatched key":
        key_file.write_bytes(certs.generate_ca().key_pem())
    elif breakage == "garbage certificate":
        cert_file.write_bytes(b"not a certificate")
    elif breakage == "missing key":
        key_file.unlink()
    else:
        cert_file.write_bytes(cert_file.read_bytes()[:200])
    assert reloader.check() is False
    assert reloader.error
    assert handshake(reloader.context, pki.ca_file) == der(pki.serving)
    assert metrics.registry.get_sample_value("rocm_isolation_certificate_reload_failures_total") == 1
    assert reloader.check() is False  # the same broken files are reported once
    assert metrics.registry.get_sample_value("rocm_isolation_certificate_reload_failures_total") == 1
    renewed = pki.reissue()
    assert reloader.check() is True
    assert reloader.error is None
    assert handshake(reloader.context, pki.ca_file) == der(renewed)


def test_startup_without_a_usable_pair_fails(tmp_path: Path) -> None:
    with pytest.raises(CertificateError, match="cannot read"):
        CertificateReloader(tmp_path)


def test_tls_1_1_is_refused_and_1_2_accepted(pki: PKI) -> None:
    reloader = CertificateReloader(pki.dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ssl.SSLError):
            handshake(reloader.context, pki.ca_file, max_version=ssl.TLSVersion.TLSv1_1)
    assert handshake(reloader.context, pki.ca_file, max_version=ssl.TLSVersion.TLSv1_2)
    cert = x509.load_der_x509_certificate(handshake(reloader.context, pki.ca_file))
    assert cert.serial_number == pki.serving.cert.serial_number
