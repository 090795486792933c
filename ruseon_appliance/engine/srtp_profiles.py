"""Which SRTP protection profiles the engine offers in its DTLS handshakes, chosen from the CPU.

aiortc offers ``SRTP_AEAD_AES_256_GCM``, ``SRTP_AEAD_AES_128_GCM``, ``SRTP_AES128_CM_SHA1_80``
in that order, so aiortc viewers pick AES-256-GCM (Chromium prefers AES-CM by itself): the
cheapest with AES and carry-less multiply instructions (AES-NI + PCLMULQDQ, ARMv8 AES + PMULL),
the *most* expensive without them
(OpenSSL's constant-time software AES and GHASH). Measured here, pylibsrtp ``protect()`` of a
1212-byte packet, native / AES-NI+PCLMUL masked: AES128_CM_SHA1_80 2.58 / 5.80 µs,
AEAD_AES_128_GCM 1.57 / 6.81 µs, AEAD_AES_256_GCM 1.63 / 7.80 µs. A Raspberry Pi 4 (Cortex-A72
as shipped, without the crypto extension) and a Zero 2 W have neither instruction.

The choice is deterministic (no timing at start): on x86 the ``aes`` and ``pclmulqdq`` flags of
``/proc/cpuinfo`` *and* OpenSSL's ``OPENSSL_ia32cap`` mask if set (bits 57 and 33 of its first
64-bit word; ``~0x200000200000000`` clears both, the bench's Pi stand-in); on arm64 the ``aes``
and ``pmull`` Features. Without them only ``SRTP_AES128_CM_SHA1_80`` is offered: it is
mandatory-to-implement in WebRTC (RFC 8827), so every browser accepts it. It has to be the only
one, not merely the first: the DTLS server picks by *its own* preference among the profiles the
client lists, and while the engine is the DTLS server for offers that leave it the choice
(``actpass``, what browsers and aiortc send: ``aiortc_internals.answer_as_dtls_server``), so its
order decides, an offer of ``setup:passive`` makes the viewer the server. Unknown CPU: aiortc's
list, unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ruseon_appliance.config import SRTP_PROFILE_NAMES

CPUINFO = Path("/proc/cpuinfo")
# OPENSSL_ia32cap's first word is (CPUID.1:ECX << 32) | CPUID.1:EDX.
IA32CAP_AES = 1 << 57
IA32CAP_PCLMULQDQ = 1 << 33
AIORTC_ORDER = SRTP_PROFILE_NAMES
NO_AES_PROFILES = ("SRTP_AES128_CM_SHA1_80",)


@dataclass(frozen=True, slots=True)
class AesCapability:
    """Whether the CPU (as OpenSSL will use it) has hardware AES and carry-less multiply:
    ``True``/``False``, or ``None`` when it cannot tell; ``why`` says what decided it."""

    hardware: bool | None
    why: str


def _parse_uint64(text: str) -> int | None:
    text = text.strip()
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text, 10)
    except ValueError:
        return None
    return value & 0xFFFF_FFFF_FFFF_FFFF


def ia32cap_allows(setting: str, bits: int) -> bool | None:
    """Whether ``OPENSSL_ia32cap=setting`` leaves all of ``bits`` (of the first word) to what the
    CPU reports: ``~MASK`` clears MASK's bits, ``VALUE`` replaces the word (so the bits must be
    set in it), ``:SECOND`` leaves the first word alone. ``None``: not a value OpenSSL parses."""
    first = setting.split(":", 1)[0]
    if first == "":
        return True
    if first.startswith("~"):
        mask = _parse_uint64(first[1:])
        return None if mask is None else not mask & bits
    value = _parse_uint64(first)
    return None if value is None else value & bits == bits


def _cpuinfo_words(cpuinfo: str, key: str) -> set[str] | None:
    match = re.search(rf"^{key}\s*:(.*)$", cpuinfo, re.M)
    return None if match is None else set(match.group(1).split())


def aes_capability(cpuinfo: str, environ: Mapping[str, str]) -> AesCapability:
    """Decide from ``/proc/cpuinfo``'s text and the environment (OpenSSL's mask)."""
    flags = _cpuinfo_words(cpuinfo, "flags")
    if flags is not None:  # x86
        if not {"aes", "pclmulqdq"} <= flags:
            return AesCapability(False, "x86 without aes+pclmulqdq in /proc/cpuinfo")
        setting = environ.get("OPENSSL_ia32cap")
        if setting is not None:
            allowed = ia32cap_allows(setting, IA32CAP_AES | IA32CAP_PCLMULQDQ)
            if allowed is None:
                return AesCapability(None, f"OPENSSL_ia32cap={setting!r} not understood")
            if not allowed:
                return AesCapability(False, f"AES-NI/PCLMULQDQ masked by "
                                            f"OPENSSL_ia32cap={setting}")
        return AesCapability(True, "x86 aes+pclmulqdq")
    features = _cpuinfo_words(cpuinfo, "Features")
    if features is not None:  # arm
        if {"aes", "pmull"} <= features:
            return AesCapability(True, "arm aes+pmull")
        return AesCapability(False, "arm without aes+pmull in /proc/cpuinfo Features")
    return AesCapability(None, "no CPU flags found in /proc/cpuinfo")


def detect(cpuinfo_path: Path | None = None,
           environ: Mapping[str, str] | None = None) -> AesCapability:
    """:func:`aes_capability` of this machine (``CPUINFO`` and ``os.environ`` by default)."""
    path = CPUINFO if cpuinfo_path is None else cpuinfo_path
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return AesCapability(None, f"{path} unreadable: {exc.strerror}")
    return aes_capability(text, os.environ if environ is None else environ)


def choose(setting: tuple[str, ...], capability: AesCapability) -> tuple[str, ...]:
    """The profiles to offer, most preferred first: the configured list, or for ``("auto",)``
    the CPU's choice (see the module's docstring)."""
    if setting != ("auto",):
        return setting
    if capability.hardware is False:
        return NO_AES_PROFILES
    return AIORTC_ORDER
