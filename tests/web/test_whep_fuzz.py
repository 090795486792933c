"""Hypothesis throws random and mutated SDP, headers and bodies at the WHEP endpoint of a real
engine: no answer may be a 5xx, and no session may outlive the request that made it (every 201
is DELETEd, and the engine must then hold no session)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp.test_utils import TestClient
from aiortc import RTCConfiguration, RTCPeerConnection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.web.conftest import running_device, web_config

T = TypeVar("T")

# A Chromium 12x recvonly video offer, as the device page sends it (candidates not yet gathered).
CHROMIUM_OFFER = "\r\n".join([
    "v=0",
    "o=- 4611731400430051336 2 IN IP4 127.0.0.1",
    "s=-",
    "t=0 0",
    "a=group:BUNDLE 0",
    "a=extmap-allow-mixed",
    "a=msid-semantic: WMS",
    "m=video 9 UDP/TLS/RTP/SAVPF 96 97 102 103 106 107 108 109 35 36",
    "c=IN IP4 0.0.0.0",
    "a=rtcp:9 IN IP4 0.0.0.0",
    "a=ice-ufrag:Qq1w",
    "a=ice-pwd:Xb2k9Yl0p8Zr7c6d5e4f3g2h",
    "a=ice-options:trickle",
    "a=fingerprint:sha-256 0F:74:31:25:CB:A2:13:EC:28:6F:6D:2C:61:FF:5D:C2:BC:B9:DB:3D:98:14:8D:"
    "1A:BB:EA:33:0C:A4:60:A8:8E",
    "a=setup:actpass",
    "a=mid:0",
    "a=extmap:1 urn:ietf:params:rtp-hdrext:toffset",
    "a=extmap:3 http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01",
    "a=recvonly",
    "a=rtcp-mux",
    "a=rtcp-rsize",
    "a=rtpmap:96 VP8/90000",
    "a=rtcp-fb:96 goog-remb",
    "a=rtcp-fb:96 nack",
    "a=rtcp-fb:96 nack pli",
    "a=rtpmap:97 rtx/90000",
    "a=fmtp:97 apt=96",
    "a=rtpmap:102 H264/90000",
    "a=rtcp-fb:102 nack",
    "a=rtcp-fb:102 nack pli",
    "a=fmtp:102 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42001f",
    "a=rtpmap:103 rtx/90000",
    "a=fmtp:103 apt=102",
    "a=rtpmap:106 H264/90000",
    "a=rtcp-fb:106 nack",
    "a=rtcp-fb:106 nack pli",
    "a=fmtp:106 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f",
    "a=rtpmap:107 rtx/90000",
    "a=fmtp:107 apt=106",
    "a=rtpmap:108 H264/90000",
    "a=fmtp:108 level-asymmetry-allowed=1;packetization-mode=0;profile-level-id=42e01f",
    "a=rtpmap:109 rtx/90000",
    "a=fmtp:109 apt=108",
    "a=rtpmap:35 H264/90000",
    "a=fmtp:35 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=4d001f",
    "a=rtpmap:36 rtx/90000",
    "a=fmtp:36 apt=35",
    "",
])

CONTENT_TYPES = [
    "application/sdp", "application/SDP", "application/sdp; charset=utf-8", "text/plain",
    "application/trickle-ice-sdpfrag", "multipart/form-data; boundary=x", "",
]
# Header values a client can send: printable latin-1, no CR/LF.
header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=80,
)


class DeviceThread:
    """The real device on an event loop in a worker thread, so that synchronous hypothesis
    examples can drive it one request at a time."""

    def __init__(self, tmp_path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._device = running_device(web_config(webrtc={"max_viewers": 1000}), tmp_path)
        self.capture, self.engine, self.client = self.run(self._device.__aenter__())
        self.aiortc_offer = self.run(self._make_aiortc_offer())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _make_aiortc_offer(self) -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = str(pc.localDescription.sdp)
        await pc.close()
        return sdp

    def close(self) -> None:
        self.run(self._device.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def fuzz_device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeviceThread]:
    device = DeviceThread(tmp_path_factory.mktemp("fuzz-state"))
    yield device
    device.close()


@st.composite
def mutated_sdp(draw: st.DrawFn, base: str) -> str:
    """A real offer with lines deleted, duplicated, swapped, corrupted or added."""
    lines = base.split("\r\n")
    for _ in range(draw(st.integers(1, 6))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "attr", "digits",
                                   "truncate", "codec"]))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "replace":
            lines[i] = draw(st.text(max_size=60))
        elif op == "attr":
            lines.insert(i, "a=" + draw(st.text(max_size=40)))
        elif op == "digits":
            lines[i] = "".join(
                str(draw(st.integers(0, 2**32))) if c.isdigit() else c for c in lines[i]
            )
        elif op == "truncate":
            lines[i] = lines[i][: draw(st.integers(0, max(0, len(lines[i]) - 1)))]
        else:
            lines[i] = lines[i].replace("H264", draw(st.sampled_from(["h264", "VP9", "H265", ""])))
    separator = draw(st.sampled_from(["\r\n", "\n", "\r"]))
    return separator.join(lines)


@st.composite
def whep_request(draw: st.DrawFn, offers: list[str]) -> tuple[str, str, dict[str, str], bytes]:
    """(method, path, headers, body) aimed mostly at POST /whep."""
    body_kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "valid", "bytes", "text"]))
    if body_kind == "mutated":
        body = draw(mutated_sdp(draw(st.sampled_from(offers)))).encode("utf-8", "surrogatepass")
    elif body_kind == "valid":
        body = draw(st.sampled_from(offers)).encode()
    elif body_kind == "bytes":
        body = draw(st.binary(max_size=3000))
    else:
        body = draw(st.text(max_size=500)).encode("utf-8", "surrogatepass")
    # Mostly the right type, so that most bodies reach the engine's offer parser.
    content_type = st.just("application/sdp") | st.sampled_from(CONTENT_TYPES) | header_text
    headers = {"Content-Type": draw(content_type)}
    for name in ("If-Match", "Authorization", "Accept"):
        if draw(st.booleans()):
            headers[name] = draw(header_text)
    if draw(st.integers(0, 9)) == 0:  # a foreign origin is refused before anything else
        headers["Origin"] = draw(header_text)
    method = draw(st.sampled_from(["POST"] * 6 + ["PATCH", "DELETE", "GET", "OPTIONS", "PUT"]))
    path = draw(st.sampled_from(["/whep"] * 4 + ["/whep/sessions/", "/whep/sessions/x" * 3,
                                                 "/whep/", "/api/status"]))
    return method, path, headers, body


def test_whep_fuzz_no_5xx_and_no_leaked_session(fuzz_device: DeviceThread) -> None:
    offers = [fuzz_device.aiortc_offer, CHROMIUM_OFFER]
    client: TestClient[Any, Any] = fuzz_device.client
    engine = fuzz_device.engine
    outcomes: dict[int, int] = {}

    async def exchange(method: str, path: str, headers: dict[str, str], body: bytes) -> int:
        response = await client.request(method, path, headers=headers, data=body)
        text = await response.text(errors="replace")
        assert response.status < 500, (response.status, text, headers, body[:300])
        if response.status >= 400:
            assert response.content_type == "application/problem+json", (response.status, text)
        if response.status == 201:
            location = response.headers["Location"]
            session_id = location.rsplit("/", 1)[1]
            assert session_id in engine.sessions
            deleted = await client.delete(location)
            assert deleted.status == 200
        assert not engine.sessions, "a session outlived its request"
        return response.status

    @settings(
        max_examples=250,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(whep_request(offers))
    def one(request: tuple[str, str, dict[str, str], bytes]) -> None:
        status = fuzz_device.run(exchange(*request))
        outcomes[status] = outcomes.get(status, 0) + 1

    one()
    # The generator really reached the engine both ways: sessions were made and offers refused.
    assert outcomes.get(201, 0) > 0, outcomes
    assert sum(n for s, n in outcomes.items() if s in (400, 406, 422)) > 0, outcomes
    assert not engine.sessions
