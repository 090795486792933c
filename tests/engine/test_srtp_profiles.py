"""The SRTP profile the engine offers follows the CPU's AES instructions (and OpenSSL's mask).

The CPU is stood in for by a /proc/cpuinfo text and the ``OPENSSL_ia32cap`` variable the engine
reads at start; the viewers are real aiortc peers (which offer AES-256-GCM first, as browsers
do) over real UDP, decoding every frame.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.engine import Engine, srtp_profiles
from ruseon_appliance.engine.srtp_profiles import AesCapability, aes_capability, choose
from tests.engine.conftest import wait_for, webrtc_config
from tests.engine.test_fanout import CameraLog, DecodeErrors, connect, decode_errors, gaps

__all__ = ["decode_errors"]  # the fixture, used by name

X86 = "processor\t: 0\nflags\t\t: fpu sse2 ssse3 sse4_1 sse4_2 aes pclmulqdq avx avx2\n"
X86_NO_AES = "processor\t: 0\nflags\t\t: fpu sse2 ssse3 sse4_1 sse4_2 avx\n"
PI4 = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"
PI5 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n"
MASK = "~0x200000200000000"  # what bench/fanout.py --aes-mask sets: AES-NI and PCLMULQDQ off
CM = "SRTP_AES128_CM_SHA1_80"


@pytest.mark.parametrize(("cpuinfo", "environ", "hardware"), [
    (X86, {}, True),
    (X86, {"OPENSSL_ia32cap": MASK}, False),
    (X86, {"OPENSSL_ia32cap": "~0x200000000000000"}, False),  # AES-NI alone
    (X86, {"OPENSSL_ia32cap": "~0x200000000"}, False),  # PCLMULQDQ alone
    (X86, {"OPENSSL_ia32cap": "~0x4000000000000000"}, True),  # another bit
    (X86, {"OPENSSL_ia32cap": ":~0x0"}, True),  # second word only
    (X86, {"OPENSSL_ia32cap": "0x200000200000000"}, True),  # the word itself, both bits set
    (X86, {"OPENSSL_ia32cap": "0x1"}, False),
    (X86, {"OPENSSL_ia32cap": "~banana"}, None),
    (X86_NO_AES, {}, False),
    (PI4, {}, False),
    (PI5, {}, True),
    ("processor\t: 0\n", {}, None),
])
def test_capability_from_cpuinfo_and_openssl_mask(
        cpuinfo: str, environ: dict[str, str], hardware: bool | None) -> None:
    assert aes_capability(cpuinfo, environ).hardware is hardware


def test_choice() -> None:
    gcm_first = ("SRTP_AEAD_AES_256_GCM", "SRTP_AEAD_AES_128_GCM", CM)
    assert choose(("auto",), AesCapability(True, "")) == gcm_first
    assert choose(("auto",), AesCapability(None, "")) == gcm_first
    assert choose(("auto",), AesCapability(False, "")) == (CM,)
    configured = ("SRTP_AEAD_AES_128_GCM", CM)
    assert choose(configured, AesCapability(False, "")) == configured
    assert srtp_profiles.detect(Path("/nonexistent/cpuinfo")).hardware is None


@pytest.fixture
def x86_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The engine sees an x86 CPU with AES-NI and PCLMULQDQ, and no OpenSSL mask."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(X86)
    monkeypatch.setattr(srtp_profiles, "CPUINFO", cpuinfo)
    monkeypatch.delenv("OPENSSL_ia32cap", raising=False)
    return monkeypatch


@pytest.mark.parametrize(("mask", "setting", "expected"), [
    (None, ("auto",), "SRTP_AEAD_AES_256_GCM"),
    (MASK, ("auto",), CM),
    # Configured: the engine (the DTLS server for the viewer's actpass) picks the first of this
    # list the viewer supports (aiortc's own preference would be AES-128-GCM).
    (None, (CM, "SRTP_AEAD_AES_128_GCM"), CM),
])
async def test_viewer_negotiates_the_profile_for_the_cpu_and_decodes_every_frame(
        x86_cpu: pytest.MonkeyPatch, feed: CapturePipeline, tmp_path: Path,
        decode_errors: DecodeErrors, mask: str | None, setting: tuple[str, ...],
        expected: str) -> None:
    if mask is not None:
        x86_cpu.setenv("OPENSSL_ia32cap", mask)
    engine = Engine(webrtc_config(srtp_profiles=setting), tmp_path / "state", feed)
    await engine.start()
    camera = CameraLog(feed)
    try:
        viewer = await connect(engine)
        try:
            await wait_for(lambda: len(viewer.frames) >= 45, timeout=40)
            assert gaps(viewer, camera, start=5) == [], gaps(viewer, camera, start=5)[:5]
            assert decode_errors.count == 0
            session = engine.sessions[viewer.session_id]
            assert session.stats()["srtp_profile"] == expected
            # The viewer's own DTLS transport agrees (the engine's picked).
            dtls = viewer.pc.getTransceivers()[0].receiver.transport
            assert dtls._ssl.get_selected_srtp_profile().decode() == expected
            srtp = engine.stats()["srtp"]
            assert srtp["sessions"] == {expected: 1}
            assert srtp["hardware_aes"] == (0 if mask else 1)
            assert srtp["profiles"][0] == (CM if mask else setting[0] if setting != ("auto",)
                                           else "SRTP_AEAD_AES_256_GCM")
        finally:
            await viewer.close()
    finally:
        camera.close()
        await engine.stop()
