"""``certs``: the files, their modes, the names in the certificate, CA reuse."""

from __future__ import annotations

import argparse
import ipaddress
import stat
from pathlib import Path

from cryptography import x509

from webhook.service import certs


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    certs.add_arguments(parser)
    return certs.main(parser.parse_args(list(argv)))


def sans(path: Path) -> tuple[list[str], list[str]]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ext.get_values_for_type(x509.DNSName), [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)]


def test_writes_ca_and_serving_pair_with_private_keys_0600(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert run("--out-dir", str(out)) == 0
    for name in ("ca.key", "tls.key"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600
    for name in ("ca.crt", "tls.crt"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644
    dns, ips = sans(out / "tls.crt")
    assert dns == [
        "rocm-isolation-webhook",
        "rocm-isolation-webhook.rocm-isolation-system",
        "rocm-isolation-webhook.rocm-isolation-system.svc",
        "rocm-isolation-webhook.rocm-isolation-system.svc.cluster.local",
        "localhost",
    ]
    assert ips == ["127.0.0.1"]
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    serving = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    serving.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert serving.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_names_validity_and_no_localhost(tmp_path: Path) -> None:
    out = tmp_path / "c"
    code = run(
        "--out-dir", str(out), "--service", "wh", "--namespace", "gpu", "--dns-name", "wh.example.com",
        "--ip", "10.0.0.7", "--no-localhost", "--days", "7",
    )  # fmt: skip
    assert code == 0
    dns, ips = sans(out / "tls.crt")
    assert dns == ["wh", "wh.gpu", "wh.gpu.svc", "wh.gpu.svc.cluster.local", "wh.example.com"]
    assert ips == ["10.0.0.7"]
    serving = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    days = (serving.not_valid_after_utc - serving.not_valid_before_utc).days
    assert days == 7


def test_existing_ca_is_reused_unless_new_ca(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert run("--out-dir", str(out)) == 0
    ca_before = (out / "ca.crt").read_bytes()
    tls_before = (out / "tls.crt").read_bytes()
    assert run("--out-dir", str(out)) == 0
    assert (out / "ca.crt").read_bytes() == ca_before
    assert (out / "tls.crt").read_bytes() != tls_before
    assert run("--out-dir", str(out), "--new-ca") == 0
    assert (out / "ca.crt").read_bytes() != ca_before


def test_external_ca(tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    assert run("--out-dir", str(ca_dir)) == 0
    out = tmp_path / "serving"
    assert run("--out-dir", str(out), "--ca-cert", str(ca_dir / "ca.crt"), "--ca-key", str(ca_dir / "ca.key")) == 0
    assert not (out / "ca.key").exists()
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    x509.load_pem_x509_certificate((out / "tls.crt").read_bytes()).verify_directly_issued_by(ca)
    assert (out / "ca.crt").read_bytes() == (ca_dir / "ca.crt").read_bytes()


def test_bad_options_are_refused(tmp_path: Path) -> None:
    assert run("--out-dir", str(tmp_path / "a"), "--days", "0") == 2
    assert run("--out-dir", str(tmp_path / "b"), "--ca-cert", "x") == 2
    assert run("--out-dir", str(tmp_path / "c"), "--ip", "not-an-ip") == 1
    other = tmp_path / "other"
    assert run("--out-dir", str(other)) == 0
    mine = tmp_path / "mine"
    assert run("--out-dir", str(mine)) == 0
    # A CA certificate with somebody else's key.
    assert (
        run("--out-dir", str(tmp_path / "d"), "--ca-cert", str(mine / "ca.crt"), "--ca-key", str(other / "ca.key")) == 1
    )
    assert ipaddress.ip_address("127.0.0.1")
