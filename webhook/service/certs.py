"""``certs``: a CA and a serving certificate for the webhook Service (for development and for
clusters without cert-manager).

The serving certificate names the Service as the apiserver dials it (``NAME.NS.svc``) and its
other spellings, plus ``localhost`` and 127.0.0.1 for ``make run``. Keys are ECDSA P-256 (cheap
handshakes). Private keys are written with mode 0600; ``certs/`` is git-ignored.

An existing CA in the output directory (``ca.crt`` + ``ca.key``) is reused unless ``--new-ca``:
re-issuing the serving certificate then keeps the ``caBundle`` already in the cluster valid.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_SERVICE = "rocm-isolation-webhook"
DEFAULT_NAMESPACE = "rocm-isolation-system"
DEFAULT_DAYS = 365
DEFAULT_CA_DAYS = 3650
CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"

PrivateKey = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Issued:
    cert: x509.Certificate
    key: PrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def service_dns_names(service: str = DEFAULT_SERVICE, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _certificate(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: dt.datetime,
    not_after: dt.datetime,
) -> x509.CertificateBuilder:
    """The fields every certificate here shares (valid from 5 minutes ago, to tolerate clock skew)."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
    )


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def generate_ca(common_name: str = f"{DEFAULT_SERVICE}-ca", *, days: int = DEFAULT_CA_DAYS) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        _certificate(name, name, key.public_key(), now, now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def generate_serving(
    ca: Issued,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    *,
    days: int = DEFAULT_DAYS,
) -> Issued:
    if not dns_names:
        raise ValueError("a serving certificate needs at least one DNS name")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    not_after = min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc)
    san: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    san += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])])
    cert = (
        _certificate(subject, ca.cert.subject, key.public_key(), now, not_after)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(cert, key)


def _write(path: Path, data: bytes, *, private: bool) -> None:
    """Write atomically (temp file + rename), private files with mode 0600 from the start."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_ca(cert_path: Path, key_path: Path) -> Issued:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: only ECDSA CA keys are supported")
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
        raise ValueError(f"{key_path} is not the key of {cert_path}")
    return Issued(cert, key)


def write_certificates(
    out_dir: Path,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = ("127.0.0.1",),
    days: int = DEFAULT_DAYS,
    ca_days: int = DEFAULT_CA_DAYS,
    ca: Issued | None = None,
    new_ca: bool = False,
) -> tuple[Issued, Issued]:
    """Write ca.crt, ca.key (unless ``ca`` is given), tls.crt and tls.key; return (ca, serving)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = out_dir / CA_CERT, out_dir / CA_KEY
    if ca is None:
        if not new_ca and ca_cert.exists() and ca_key.exists():
            ca = load_ca(ca_cert, ca_key)
        else:
            ca = generate_ca(days=ca_days)
            _write(ca_key, ca.key_pem(), private=True)
            _write(ca_cert, ca.cert_pem(), private=False)
    else:
        # An external CA: its certificate goes next to the serving pair (the bundle clients trust).
        _write(ca_cert, ca.cert_pem(), private=False)
    serving = generate_serving(ca, dns_names, ip_addresses, days=days)
    # Key first: a reader polling the pair sees a mismatch (rejected, retried), never a stale key.
    _write(out_dir / TLS_KEY, serving.key_pem(), private=True)
    _write(out_dir / TLS_CERT, serving.cert_pem(), private=False)
    return ca, serving


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", type=Path, default=Path("certs"), help="where to write the files (default: certs)")
    parser.add_argument("--service", default=DEFAULT_SERVICE, help=f"Service name (default: {DEFAULT_SERVICE})")
    parser.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help=f"namespace of the Service (default: {DEFAULT_NAMESPACE})"
    )
    parser.add_argument(
        "--dns-name", action="append", default=[], metavar="NAME", help="an extra DNS name (repeatable)"
    )
    parser.add_argument("--ip", action="append", default=[], metavar="ADDR", help="an extra IP address (repeatable)")
    parser.add_argument(
        "--no-localhost", action="store_true", help="do not add localhost and 127.0.0.1 (for in-cluster only)"
    )
    parser.add_argument(
        "--days", type=int, default=DEFAULT_DAYS, help=f"serving certificate validity (default: {DEFAULT_DAYS})"
    )
    parser.add_argument(
        "--ca-days", type=int, default=DEFAULT_CA_DAYS, help=f"CA validity (default: {DEFAULT_CA_DAYS})"
    )
    parser.add_argument("--ca-cert", type=Path, help="sign with this existing CA certificate (with --ca-key)")
    parser.add_argument("--ca-key", type=Path, help="the existing CA's private key (ECDSA, unencrypted PEM)")
    parser.add_argument("--new-ca", action="store_true", help="make a new CA even if OUT_DIR already has one")


def main(args: argparse.Namespace) -> int:
    if args.days < 1 or args.ca_days < 1:
        print("certs: --days and --ca-days must be at least 1", file=sys.stderr)
        return 2
    if (args.ca_cert is None) != (args.ca_key is None):
        print("certs: --ca-cert and --ca-key go together", file=sys.stderr)
        return 2
    dns_names = [*service_dns_names(args.service, args.namespace), *args.dns_name]
    ips = list(args.ip)
    if not args.no_localhost:
        dns_names.append("localhost")
        ips.insert(0, "127.0.0.1")
    try:
        for ip in ips:
            ipaddress.ip_address(ip)
        ca = load_ca(args.ca_cert, args.ca_key) if args.ca_cert else None
        ca, serving = write_certificates(
            args.out_dir,
            dns_names=dns_names,
            ip_addresses=ips,
            days=args.days,
            ca_days=args.ca_days,
            ca=ca,
            new_ca=args.new_ca,
        )
    except (OSError, ValueError) as err:
        print(f"certs: {err}", file=sys.stderr)
        return 1
    print(
        f"wrote {args.out_dir}/{TLS_CERT} and {TLS_KEY} for {', '.join(dns_names + ips)} "
        f"(valid until {serving.cert.not_valid_after_utc:%Y-%m-%d}), signed by {args.out_dir}/{CA_CERT}"
    )
    return 0
