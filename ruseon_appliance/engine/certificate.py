"""The appliance's one DTLS certificate: ECDSA P-256, kept in the state directory.

Every viewer's connection presents this certificate, so the fingerprint in every answer is the
same and survives restarts. It is generated once, valid for a year, and replaced at start-up when
fewer than :data:`RENEW_BEFORE` remain.
"""

from __future__ import annotations

import datetime
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from aiortc import RTCCertificate
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

logger = logging.getLogger(__name__)

KEY_FILE = "dtls-key.pem"
CERT_FILE = "dtls-cert.pem"
VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True, slots=True)
class DtlsCertificate:
    """The loaded certificate, ready for aiortc, with its SDP fingerprint."""

    rtc: RTCCertificate
    # "sha-256 AB:CD:..." exactly as it appears in an answer's a=fingerprint line.
    fingerprint: str
    not_after: datetime.datetime
    generated: bool


def _fingerprint(cert: x509.Certificate) -> str:
    digest = cert.fingerprint(hashes.SHA256()).hex().upper()
    return "sha-256 " + ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def _generate(now: datetime.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    common_name = "ruseon-" + secrets.token_hex(8)
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # A day of slack for clocks that are behind (a Pi without RTC boots in the past).
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + VALIDITY)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte, atomically."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _load(state_dir: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    key_path, cert_path = state_dir / KEY_FILE, state_dir / CERT_FILE
    if not key_path.exists() or not cert_path.exists():
        return None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (ValueError, TypeError, OSError) as exc:
        logger.warning("DTLS certificate in %s is unreadable (%s); generating a new one",
                       state_dir, exc)
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        logger.warning("DTLS key in %s is not ECDSA P-256; generating a new one", state_dir)
        return None
    if cert.public_key() != key.public_key():
        logger.warning("DTLS certificate in %s does not match its key; generating a new one",
                       state_dir)
        return None
    return key, cert


def load_or_create_certificate(
    state_dir: Path, *, now: datetime.datetime | None = None
) -> DtlsCertificate:
    """Load the certificate from ``state_dir``, or generate and save one.

    The directory is created with mode 0700 and the key written with mode 0600. A certificate
    with fewer than 30 days left (relative to ``now``) is replaced.
    """
    now = now or datetime.datetime.now(tz=datetime.UTC)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)

    loaded = _load(state_dir)
    generated = False
    if loaded is not None and loaded[1].not_valid_after_utc - now < RENEW_BEFORE:
        logger.info("DTLS certificate expires %s, less than %d days away; renewing",
                    loaded[1].not_valid_after_utc.isoformat(), RENEW_BEFORE.days)
        loaded = None
    if loaded is None:
        key, cert = _generate(now)
        write_private(
            state_dir / KEY_FILE,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        write_private(state_dir / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM))
        generated = True
    else:
        key, cert = loaded
    os.chmod(state_dir / KEY_FILE, 0o600)

    fingerprint = _fingerprint(cert)
    logger.info(
        "DTLS certificate %s (%s, valid until %s)",
        fingerprint,
        "generated" if generated else "loaded",
        cert.not_valid_after_utc.date().isoformat(),
    )
    return DtlsCertificate(
        rtc=RTCCertificate(key=key, cert=cert),
        fingerprint=fingerprint,
        not_after=cert.not_valid_after_utc,
        generated=generated,
    )
