"""The device page's own HTTPS certificate (``[http] tls = "self-signed"``).

Made once (ECDSA P-256, SHA-256, 825 days: the longest validity Apple's platforms accept for a
TLS server certificate) and kept in the state directory, key 0600, so its fingerprint stays the
same across restarts and the exception a browser was told to make keeps working. Its names are
the board's: the hostname, ``<hostname>.local``, ``localhost``, and the addresses it has when the
certificate is made, plus 127.0.0.1 and ::1. It is made again only when it is missing or
unusable, when its names no longer cover the hostname (the board was renamed), or when fewer
than :data:`RENEW_BEFORE` remain; an address that changes later (DHCP) does not: the browser's
warning is the same either way, and the fingerprint would change every time.

A self-signed certificate is not trusted by any browser: the user compares the fingerprint the
browser shows with the one in the journal (and on ``/api/status``) once, and accepts it.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ruseon_appliance.engine.certificate import write_private

logger = logging.getLogger(__name__)

CERT_FILE = "https-cert.pem"
KEY_FILE = "https-key.pem"
VALIDITY = datetime.timedelta(days=825)
RENEW_BEFORE = datetime.timedelta(days=30)
# Always in the certificate, whatever the board's interfaces are.
LOOPBACK_ADDRESSES = ("127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class HttpsCertificate:
    """A certificate and key on disk for the HTTP server, with what ``/api/status`` shows."""

    mode: str  # "self-signed" (made here) or "files" (http.tls_cert / tls_key)
    cert_path: Path
    key_path: Path
    # SHA-256 of the DER certificate, "AB:CD:...", as browsers show it.
    fingerprint: str
    names: tuple[str, ...]
    addresses: tuple[str, ...]
    not_after: datetime.datetime
    generated: bool = False

    def server_context(self) -> ssl.SSLContext:
        """A server context presenting this certificate (OSError / ssl.SSLError if unusable)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_path, self.key_path)
        return context

    def status(self) -> dict[str, Any]:
        """The ``https`` section of ``/api/status``."""
        return {
            "mode": self.mode,
            "fingerprint_sha256": self.fingerprint,
            "names": list(self.names),
            "addresses": list(self.addresses),
            "not_after": self.not_after.isoformat(),
            "certificate": str(self.cert_path),
        }


def certificate_names(hostname: str) -> tuple[str, ...]:
    """The DNS names a certificate for ``hostname`` carries: it, its short name and
    ``<short>.local`` (mDNS), and ``localhost``; lower case, without duplicates."""
    names: list[str] = []
    host = hostname.strip().rstrip(".").lower()
    short = host.split(".", 1)[0]
    for name in (host, short, f"{short}.local" if short else "", "localhost"):
        if name and name.isascii() and name not in names:
            names.append(name)
    return tuple(names)


def certificate_addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    """The IP addresses a certificate carries: ``addresses`` (zones dropped, non-addresses
    left out) and the loopback ones, without duplicates."""
    found: list[str] = []
    for text in (*addresses, *LOOPBACK_ADDRESSES):
        try:
            ip = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            continue
        if ip.is_unspecified or str(ip) in found:
            continue
        found.append(str(ip))
    return tuple(found)


def load_or_create(state_dir: Path, hostname: str, addresses: Iterable[str], *,
                   now: datetime.datetime | None = None) -> HttpsCertificate:
    """The self-signed certificate in ``state_dir``, made now if it is missing or unusable, if
    it does not name ``hostname``, or if it expires within :data:`RENEW_BEFORE`."""
    now = now or datetime.datetime.now(tz=datetime.UTC)
    cert_path, key_path = state_dir / CERT_FILE, state_dir / KEY_FILE
    names = certificate_names(hostname)
    cert = _usable(cert_path, key_path, names, now)
    generated = cert is None
    if cert is None:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _self_signed(key, names, certificate_addresses(addresses), now)
        write_private(key_path, key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
        write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    key_path.chmod(0o600)
    return _described("self-signed", cert_path, key_path, cert, generated)


def from_files(cert_file: str, key_file: str) -> HttpsCertificate:
    """``http.tls_cert`` / ``tls_key`` as given (their fingerprint for the status). Raises
    OSError or ValueError when the certificate cannot be read."""
    cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    return _described("files", Path(cert_file), Path(key_file), cert, False)


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the DER certificate as ``AB:CD:...``."""
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _described(mode: str, cert_path: Path, key_path: Path, cert: x509.Certificate,
               generated: bool) -> HttpsCertificate:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = tuple(sans.get_values_for_type(x509.DNSName))
        addresses = tuple(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        names, addresses = (), ()
    return HttpsCertificate(mode, cert_path, key_path, fingerprint(cert), names, addresses,
                            cert.not_valid_after_utc, generated)


def _usable(cert_path: Path, key_path: Path, names: tuple[str, ...],
            now: datetime.datetime) -> x509.Certificate | None:
    """The certificate on disk when it can be kept, else None (saying why in the log)."""
    if not cert_path.exists() and not key_path.exists():
        return None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (ValueError, TypeError, OSError) as exc:
        logger.warning("HTTPS certificate in %s is unreadable (%s); making a new one",
                       cert_path.parent, exc)
        return None
    if cert.public_key() != key.public_key():
        logger.warning("HTTPS certificate %s does not match its key; making a new one",
                       cert_path)
        return None
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        held = set(sans.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        held = set()
    if not set(names) - {"localhost"} <= held:
        logger.info("HTTPS certificate names %s, not this board's %s; making a new one",
                    ", ".join(sorted(held)) or "nothing", ", ".join(names))
        return None
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        logger.info("HTTPS certificate expires %s; making a new one",
                    cert.not_valid_after_utc.date().isoformat())
        return None
    return cert


def _self_signed(key: ec.EllipticCurvePrivateKey, names: tuple[str, ...],
                 addresses: tuple[str, ...], now: datetime.datetime) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0]),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "RUSEON Appliance")])
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in addresses]
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        # A day of slack for clocks that are behind (a Pi without RTC boots in the past).
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        # An end-entity certificate (Firefox refuses a CA certificate as a server's).
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
