"""WHEP conformance as an independent client checks it (draft-ietf-wish-whep, WHIP = RFC 9725).

Each case sends one request, good or deliberately bad, and compares the status code and the
headers with what the draft requires. No public conformance suite exists, so the cases are the
draft's MUSTs and the device's documented error answers (problem+json bodies).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import secrets
from dataclasses import dataclass
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver

from hil.device import Device, HttpAnswer

PROBLEM_JSON = "application/problem+json"
SDPFRAG = "application/trickle-ice-sdpfrag"


@dataclass
class Case:
    """One request and whether the answer met the requirement."""

    name: str
    ok: bool
    detail: str
    # Not tried (the rig could not set it up); counts as neither passed nor failed.
    skipped: bool = False

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form for the report."""
        return {"case": self.name, "ok": self.ok, "detail": self.detail,
                "skipped": self.skipped}


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


def with_fresh_ice_credentials(offer: str) -> str:
    """``offer`` with a new ICE ufrag and password, so the device sees one more distinct viewer
    without the cost of another peer connection."""
    ufrag, pwd = secrets.token_hex(4), secrets.token_hex(12)
    lines = []
    for line in offer.split("\r\n"):
        if line.startswith("a=ice-ufrag:"):
            line = "a=ice-ufrag:" + ufrag
        elif line.startswith("a=ice-pwd:"):
            line = "a=ice-pwd:" + pwd
        lines.append(line)
    return "\r\n".join(lines)


def trickle_fragment(offer: str) -> str:
    """A trickle-ice-sdpfrag (RFC 8840) for ``offer``'s session: its ufrag/pwd, its first media
    section with one host candidate and end-of-candidates.

    The candidate is on loopback (127.0.0.1, discard port) so that a device which does use
    trickled candidates sends its checks nowhere but to itself.
    """
    ufrag = pwd = mid = ""
    for line in offer.splitlines():
        if line.startswith("a=ice-ufrag:") and not ufrag:
            ufrag = line.split(":", 1)[1]
        elif line.startswith("a=ice-pwd:") and not pwd:
            pwd = line.split(":", 1)[1]
        elif line.startswith("a=mid:") and not mid:
            mid = line.split(":", 1)[1]
    return ("\r\n".join([
        f"a=ice-ufrag:{ufrag}", f"a=ice-pwd:{pwd}", "m=video 9 UDP/TLS/RTP/SAVPF 0",
        f"a=mid:{mid or '0'}", "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host",
        "a=end-of-candidates",
    ]) + "\r\n")


def retry_after_ok(value: str | None) -> bool:
    """True for a valid ``Retry-After``: delay-seconds (> 0) or an HTTP-date (RFC 9110)."""
    if not value:
        return False
    value = value.strip()
    if value.isdigit():
        return int(value) > 0
    try:
        return email.utils.parsedate_to_datetime(value) is not None
    except (TypeError, ValueError):
        return False


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


async def run_cases(device: Device, *, max_offer_bytes: int = 64 * 1024,
                    fill_limit: int = 32) -> list[Case]:
    """Every conformance case against ``device``; none raises for a bad answer.

    ``fill_limit``: the most sessions the harness opens to reach the device's viewer limit for
    the 503 case (a device configured for more is not filled; the case is reported as skipped).
    """
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

    viewing_open = True
    if device.token:
        # Admin routes always need the credential, whatever viewing needs.
        metrics = await device.request("GET", "/metrics", auth=False)
        cases.append(_status_case("GET /metrics without token -> 401", metrics, (401,)))
        session = await device.request("GET", "/api/session", auth=False)
        viewing_open = session.status == 200 and b'"viewing": "open"' in session.body
    if device.token and not viewing_open:
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
        challenge = wrong.header("WWW-Authenticate") or ""
        cases.append(Case("401 (wrong token) has WWW-Authenticate: Bearer",
                          challenge.lower().startswith("bearer"), challenge or "missing"))

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
            trickle = await device.request("PATCH", location, body=trickle_fragment(offer),
                                           headers={"Content-Type": SDPFRAG})
            cases.append(_status_case(f"PATCH {SDPFRAG} -> 204", trickle, (204,)))
            wrong_patch = await device.request("PATCH", location, body=trickle_fragment(offer),
                                               headers={"Content-Type": "text/plain"})
            cases.append(_status_case("PATCH text/plain -> 415", wrong_patch, (415,)))
            deleted = await device.request("DELETE", location)
            cases.append(_status_case("DELETE session -> 200", deleted, (200,)))
            again = await device.request("DELETE", location)
            cases.append(_status_case("DELETE it again -> 404", again, (404,)))
    cases.extend(await _capacity_cases(device, offer, fill_limit))
    return cases


async def _viewer_count(device: Device) -> tuple[int | None, int | None]:
    """``(viewers.count, webrtc.max_viewers)`` from ``/api/status`` (None where absent)."""
    answer = await device.request("GET", "/api/status")
    if answer.status != 200:
        return None, None
    doc = json.loads(answer.body)
    count = (doc.get("viewers") or {}).get("count")
    limit = (doc.get("webrtc") or {}).get("max_viewers")
    return (count if isinstance(count, int) else None,
            limit if isinstance(limit, int) else None)


async def _capacity_cases(device: Device, offer: str, fill_limit: int) -> list[Case]:
    """Offers that never connect (fresh ICE credentials each) must not lock viewers out.

    From this one address the harness opens such offers until the device refuses one or is
    full. A device that caps the places per client address refuses with 429 and
    ``Retry-After``; one whose cap is above its free places fills up, and then one more offer
    must still be answered (201): the oldest pending session gives way, since only connected
    viewers hold a place for sure. Every session opened is DELETEd again at once; the device
    must then be back at the count it started with.
    """
    name = "pending offers cannot lock viewers out"
    count, limit = await _viewer_count(device)
    if count is None or limit is None:
        return [Case(name, True, "not tried: /api/status has no viewers.count or "
                     "webrtc.max_viewers", skipped=True)]
    if limit - count > fill_limit:
        return [Case(name, True, f"not tried: {limit - count} sessions to open to reach "
                     f"max_viewers {limit} (> {fill_limit})", skipped=True)]
    headers = {"Content-Type": "application/sdp"}
    locations: list[str] = []
    cases: list[Case] = []
    try:
        refused: HttpAnswer | None = None
        for _ in range(limit - count + 1):
            answer = await device.request("POST", "/whep", body=with_fresh_ice_credentials(offer),
                                          headers=headers)
            location = answer.header("Location")
            if answer.status == 201 and location:
                locations.append(location)
            else:
                refused = answer
                break
        if refused is not None:
            cases.append(_status_case("pending offers from one address beyond its cap -> 429",
                                      refused, (429,)))
            retry = refused.header("Retry-After")
            cases.append(Case("429 has Retry-After", retry_after_ok(retry), retry or "missing"))
            cases.append(_problem_case("429 body is problem+json", refused))
        else:
            # The newcomer got a place: one pending session must have given way (it closes
            # asynchronously, so give it a moment), never exceeding max_viewers.
            now = await _viewer_count(device)
            for _ in range(50):
                if now[0] is not None and now[0] <= limit:
                    break
                await asyncio.sleep(0.1)
                now = await _viewer_count(device)
            cases.append(Case("POST beyond max viewers takes the oldest pending place -> 201",
                              now[0] is not None and now[0] <= limit,
                              f"{len(locations)} offers answered with {limit - count} places "
                              f"free; {now[0]} sessions after (max_viewers {limit})"))
    finally:
        for location in locations:
            await device.request("DELETE", location)
    after, _ = await _viewer_count(device)
    cases.append(Case("viewer count back after DELETEs", after == count,
                      f"{after} (was {count} before filling)"))
    return cases
