"""TLS client contexts for the appliance's outgoing connections (MQTT broker, webhooks).

A LAN broker or Home Assistant instance usually has a certificate from its own CA (the Mosquitto
add-on's self-made one, a home CA), which the system's CA store does not know. The admin names that
CA's PEM file instead of turning verification off: verification and host-name checks always stay
on. A broker that demands client certificates (mosquitto's ``require_certificate``) gets one.
"""

from __future__ import annotations

import ssl


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """A verifying client context: the system's CAs, or only ``ca_file``'s when it is given; a
    client certificate from ``cert_file`` (its key in ``key_file``, or in ``cert_file`` itself).

    Raises :class:`OSError` (a file cannot be read) or :class:`ssl.SSLError` (not PEM, the key
    does not match the certificate)."""
    context = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


def describe_error(exc: BaseException) -> str:
    """One line for a config error: the OS's reason for a file, OpenSSL's for its content."""
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
