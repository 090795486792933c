"""The DTLS certificate: generated once, kept private, reused, renewed before expiry."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from ruseon_appliance.engine.certificate import (
    CERT_FILE,
    KEY_FILE,
    load_or_create_certificate,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_once_private_and_reused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = load_or_create_certificate(state)
    assert first.generated
    assert mode(state) == 0o700 and mode(state / KEY_FILE) == 0o600
    assert isinstance(first.rtc._key, ec.EllipticCurvePrivateKey)
    assert isinstance(first.rtc._key.curve, ec.SECP256R1)
    remaining = first.not_after - datetime.datetime.now(tz=datetime.UTC)
    assert 360 <= remaining.days <= 366
    second = load_or_create_certificate(state)
    assert not second.generated and second.fingerprint == first.fingerprint
    # The fingerprint string is what aiortc puts in the answer.
    sha256 = next(f for f in second.rtc.getFingerprints() if f.algorithm == "sha-256")
    assert second.fingerprint == "sha-256 " + sha256.value


def test_renewed_when_less_than_30_days_remain(tmp_path: Path) -> None:
    first = load_or_create_certificate(tmp_path)
    almost_expired = first.not_after - datetime.timedelta(days=29)
    renewed = load_or_create_certificate(tmp_path, now=almost_expired)
    assert renewed.generated and renewed.fingerprint != first.fingerprint
    still_fine = renewed.not_after - datetime.timedelta(days=31)
    assert load_or_create_certificate(tmp_path, now=still_fine).fingerprint == renewed.fingerprint


def test_unreadable_files_are_replaced(tmp_path: Path) -> None:
    first = load_or_create_certificate(tmp_path)
    (tmp_path / CERT_FILE).write_text("not a certificate")
    replaced = load_or_create_certificate(tmp_path)
    assert replaced.generated and replaced.fingerprint != first.fingerprint
