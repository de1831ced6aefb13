"""The serving TLS context: TLS 1.2 or newer, and certificates reloaded when their files change.

cert-manager renews the serving certificate by rewriting the mounted Secret; the kubelet swaps
the files under a symlink, and mounted Secrets do not reliably send file events. So the files are
polled (kopf re-reads every 60 s, controller-runtime's certwatcher polls every 10 s), and a change
is confirmed by the content's digest.

Reloading calls ``load_cert_chain`` again on the *live* ``SSLContext`` uvicorn serves with: new
handshakes use the new pair, established connections keep theirs, no socket is closed. Before
that, the new pair is loaded into a scratch context: a certificate that does not match its key
(e.g. read half-way through a rewrite) or a broken file keeps the last good pair in use. The
bytes that were verified are the bytes that are loaded (they go through a private temporary
directory), so a rewrite between the check and the swap cannot slip an unverified pair in.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import ssl
import tempfile
from datetime import datetime
from pathlib import Path

from cryptography import x509

from webhook.service import polling
from webhook.service.metrics import Metrics

log = logging.getLogger("webhook.tls")

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"

# TLS 1.2 suites: forward secret AEAD only (what Kyverno and Go's defaults allow). TLS 1.3 suites are all AEAD.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


class CertificateError(Exception):
    """The certificate pair cannot be used."""


def server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    # kube-apiserver calls admission webhooks over HTTP/1.1 (kubernetes#82090).
    context.set_alpn_protocols(["http/1.1"])
    return context


class CertificateReloader:
    """Owns the live server ``SSLContext`` and keeps it loaded with the newest valid pair."""

    def __init__(self, cert_dir: Path, *, metrics: Metrics | None = None) -> None:
        self.cert_file = cert_dir / CERT_FILE
        self.key_file = cert_dir / KEY_FILE
        self.metrics = metrics
        self.context = server_context()
        self.not_after: datetime | None = None
        self.error: str | None = None
        self._digest = ""
        self._failed_digest = ""
        # At startup a missing or broken pair is fatal: there is no last good one.
        self._load(self._read())

    @property
    def loaded(self) -> bool:
        return self.not_after is not None

    def _read(self) -> tuple[bytes, bytes]:
        try:
            return self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as err:
            raise CertificateError(f"cannot read the certificate pair: {err}") from None

    def _load(self, pair: tuple[bytes, bytes]) -> None:
        cert_pem, key_pem = pair
        digest = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()
        try:
            not_after = x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
        except ValueError as err:
            raise CertificateError(f"{self.cert_file}: not a PEM certificate: {err}") from None
        scratch = Path(tempfile.mkdtemp(prefix="webhook-tls-"))
        try:
            cert_path, key_path = scratch / CERT_FILE, scratch / KEY_FILE
            cert_path.write_bytes(cert_pem)
            key_path.touch(mode=0o600)
            key_path.write_bytes(key_pem)
            try:
                server_context().load_cert_chain(cert_path, key_path)
            except (ssl.SSLError, OSError) as err:
                raise CertificateError(f"{self.cert_file}, {self.key_file}: the pair cannot be used: {err}") from None
            self.context.load_cert_chain(cert_path, key_path)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self._digest = digest
        self.not_after = not_after
        self.error = None
        if self.metrics is not None:
            self.metrics.certificate_expiry.set(not_after.timestamp())

    def check(self) -> bool:
        """Load the pair on disk if it changed and is valid. Returns True when a new pair is in use."""
        try:
            pair = self._read()
        except CertificateError as err:
            self._failed(str(err), "unreadable")
            return False
        digest = hashlib.sha256(pair[0] + b"\0" + pair[1]).hexdigest()
        if digest in (self._digest, self._failed_digest):
            return False
        try:
            self._load(pair)
        except CertificateError as err:
            self._failed(str(err), digest)
            return False
        self._failed_digest = ""
        if self.metrics is not None:
            self.metrics.certificate_reloads.inc()
        log.info(
            "serving certificate reloaded",
            extra={"cert_file": str(self.cert_file), "not_after": self.not_after.isoformat() if self.not_after else ""},
        )
        return True

    def _failed(self, message: str, digest: str) -> None:
        if digest == self._failed_digest:
            return
        self._failed_digest = digest
        self.error = message
        if self.metrics is not None:
            self.metrics.certificate_reload_failures.inc()
        log.error("certificate reload failed, keeping the last good pair", extra={"problem": message})

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """Poll every ``interval`` seconds until ``stop`` is set. Never raises.

        The check runs on the event loop thread, the thread that also makes the handshakes, so the
        swap never races a handshake reading the context.
        """

        async def check() -> None:
            self.check()

        await polling.every(interval, stop, check, what="certificate reload")
