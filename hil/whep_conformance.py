"""WHEP conformance as an independent client checks it (draft-ietf-wish-whep, WHIP = RFC 9725).

Each case sends one request, good or deliberately bad, and compares the status code and the
headers with what the draft requires. No public conformance suite exists, so the cases are the
draft's MUSTs and the device's documented error answers (problem+json bodies).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver

from hil.device import Device, HttpAnswer

PROBLEM_JSON = "application/problem+json"


@dataclass
class Case:
    """One request and whether the answer met the requirement."""

    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form for the report."""
        return {"case": self.name, "ok": self.ok, "detail": self.detail}


async def make_offer() -> str:
    """A real receive-only H.264 offer from aiortc (the peer is closed again at once)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        transceiver = pc.addTransceiver("video", direction="recvonly")
        caps = RTCRtpReceiver.getCapabilities("video")
        transceiver.setCodecPreferences(
            [c for c in caps.codecs if c.mimeType.lower() in ("video/h264", "video/rtx")]
        )
        await pc.setLocalDescription(await pc.createOffer())
        sdp: str = pc.localDescription.sdp
        return sdp
    finally:
        await pc.close()


def _status_case(name: str, answer: HttpAnswer, expected: tuple[int, ...]) -> Case:
    ok = answer.status in expected
    want = "/".join(str(s) for s in expected)
    return Case(name, ok, f"{answer.status} (want {want})")


def _problem_case(name: str, answer: HttpAnswer) -> Case:
    content_type = (answer.header("Content-Type") or "").split(";")[0].strip()
    return Case(name, content_type == PROBLEM_JSON,
                f"Content-Type {content_type or 'missing'} (want {PROBLEM_JSON})")


def answer_problems(sdp: str) -> list[str]:
    """What a WHEP answer lacks, by the draft's rules (empty when it is fine)."""
    problems = []
    lines = sdp.splitlines()
    if not sdp.startswith("v=0"):
        problems.append("does not start with v=0")
    if not any(line.startswith("a=fingerprint:sha-256") for line in lines):
        problems.append("no sha-256 fingerprint")
    if not any(line.startswith("a=ice-ufrag:") for line in lines):
        problems.append("no ice-ufrag")
    if not any(line.startswith("a=candidate:") for line in lines):
        problems.append("no candidate (a WHEP answer must carry a complete candidate list)")
    if "a=sendonly" not in lines:
        problems.append("video is not sendonly")
    if "a=rtcp-mux" not in lines:
        problems.append("no rtcp-mux")
    if not any("H264/90000" in line for line in lines if line.startswith("a=rtpmap:")):
        problems.append("no H264 codec")
    return problems


async def run_cases(device: Device, *, max_offer_bytes: int = 64 * 1024) -> list[Case]:
    """Every conformance case against ``device``; none raises for a bad answer."""
    cases: list[Case] = []
    offer = await make_offer()
    sdp_headers = {"Content-Type": "application/sdp"}

    options = await device.request("OPTIONS", "/whep", auth=False)
    cases.append(_status_case("OPTIONS /whep without auth", options, (200, 204)))
    accept_post = options.header("Accept-Post") or ""
    cases.append(Case("OPTIONS /whep has Accept-Post: application/sdp",
                      "application/sdp" in accept_post, f"Accept-Post {accept_post or 'missing'}"))

    preflight = await device.request(
        "OPTIONS", "/whep", auth=False,
        headers={"Origin": device.base_url, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"},
    )
    allowed = preflight.header("Access-Control-Allow-Methods") or ""
    cases.append(Case("CORS preflight for POST without auth",
                      preflight.status in (200, 204) and "POST" in allowed.upper(),
                      f"{preflight.status}, Allow-Methods {allowed or 'missing'}"))

    wrong_type = await device.request("POST", "/whep", body=offer,
                                      headers={"Content-Type": "text/plain"})
    cases.append(_status_case("POST text/plain -> 415", wrong_type, (415,)))
    cases.append(_problem_case("415 body is problem+json", wrong_type))

    garbage = await device.request("POST", "/whep", body="this is not SDP\r\n",
                                   headers=sdp_headers)
    cases.append(_status_case("POST malformed SDP -> 400", garbage, (400,)))
    cases.append(_problem_case("400 body is problem+json", garbage))

    huge = "v=0\r\n" + "a=x-padding:" + "x" * (max_offer_bytes + 1024) + "\r\n"
    too_large = await device.request("POST", "/whep", body=huge, headers=sdp_headers)
    cases.append(_status_case("POST oversized offer -> 413", too_large, (413,)))

    no_session = await device.request("DELETE", f"/whep/sessions/{secrets.token_urlsafe(16)}")
    cases.append(_status_case("DELETE unknown session -> 404", no_session, (404,)))
    cases.append(_problem_case("404 body is problem+json", no_session))

    if device.token:
        anonymous = await device.request("POST", "/whep", body=offer, headers=sdp_headers,
                                         auth=False)
        cases.append(_status_case("POST without token -> 401", anonymous, (401,)))
        challenge = anonymous.header("WWW-Authenticate") or ""
        cases.append(Case("401 has WWW-Authenticate: Bearer",
                          challenge.lower().startswith("bearer"), challenge or "missing"))
        wrong = await device.request(
            "POST", "/whep", body=offer, auth=False,
            headers={**sdp_headers, "Authorization": "Bearer wrong-" + secrets.token_hex(8)},
        )
        cases.append(_status_case("POST with a wrong token -> 401", wrong, (401,)))

    good = await device.request("POST", "/whep", body=offer, headers=sdp_headers)
    cases.append(_status_case("POST good offer -> 201", good, (201,)))
    if good.status == 201:
        content_type = (good.header("Content-Type") or "").split(";")[0].strip()
        cases.append(Case("201 Content-Type application/sdp", content_type == "application/sdp",
                          content_type or "missing"))
        location = good.header("Location")
        cases.append(Case("201 has Location", bool(location), location or "missing"))
        problems = answer_problems(good.text)
        cases.append(Case("answer SDP is complete", not problems, "; ".join(problems) or "ok"))
        if location:
            deleted = await device.request("DELETE", location)
            cases.append(_status_case("DELETE session -> 200", deleted, (200,)))
            again = await device.request("DELETE", location)
            cases.append(_status_case("DELETE it again -> 404", again, (404,)))
    return cases
