"""The camera's sound on the device page, in Debian's Chromium: the synthetic camera's test tone
as Opus over WHEP, muted until a real click on the page's Sound button, then played (getStats:
samples received grow, little concealment), with the level meter moving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_netns import (
    chromium,
    in_browser_netns,
    poll_page,
    running_server,
    save_screenshot,
    wait_for_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SOUND_JS = """() => ({
  audio: window.ruseon.audio,
  soundOn: window.ruseon.soundOn,
  muted: document.getElementById('video').muted,
  hidden: document.getElementById('btn-sound').hidden,
  pressed: document.getElementById('btn-sound').getAttribute('aria-pressed'),
  meter: document.getElementById('sound-level').style.width,
  statAudio: document.getElementById('stat-audio').textContent,
  ...(window.ruseon.audioStats || {}),
})"""


def sound(page: Any) -> dict[str, Any]:
    figures: dict[str, Any] = page.evaluate(SOUND_JS)
    return figures


def test_device_page_plays_the_cameras_sound_after_a_click(request: pytest.FixtureRequest,
                                                           tmp_path: Path) -> None:
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(server.url)
        wait_for_page(page, "live", lambda s: s["state"] == "live" and s["framesDecoded"] > 10)
        before = poll_page(page, sound, "the sound button offered",
                           lambda s: s["audio"] and not s["hidden"]
                           and s.get("totalSamplesReceived", 0) > 0)
        # Browsers start muted: nothing is heard until the person asks (the sound arrives and
        # is decoded all the same, so it starts at once).
        assert before["muted"] is True and before["pressed"] == "false"
        page.click("#btn-sound")  # a real (trusted) mouse click: a user gesture
        on = poll_page(page, sound, "sound on", lambda s: s["soundOn"] and not s["muted"])
        assert on["pressed"] == "true"
        start = on["totalSamplesReceived"], on["concealedSamples"]
        later = poll_page(page, sound, "three more seconds of sound",
                          lambda s: s["totalSamplesReceived"] - start[0] > 3 * 48_000)
        received = later["totalSamplesReceived"] - start[0]
        concealed = later["concealedSamples"] - start[1]
        # Little concealment: a quiet machine shows ~0 %, one at a load of 9 on 2 cores 8 %;
        # a broken stream (wrong timestamps, lost packets) conceals most of it.
        assert concealed / received < 0.2, later
        assert later["levelDb"] is not None and later["levelDb"] > -45, later
        assert "opus" in later["statAudio"].lower(), later
        # The meter follows what plays (Chromium reports no level for a muted element).
        poll_page(page, sound, "the meter moving", lambda s: s["meter"] not in ("", "0", "0%"))
        # The server sent it on this session's own SSRC, counted apart from video.
        sessions = server.status()["viewers"]["sessions"]
        audio = [s["stats"]["audio"] for s in sessions if s["stats"].get("audio")]
        assert len(audio) == 1 and audio[0]["packets_sent"] > 150, sessions
        save_screenshot(page, "browser-sound-on.png")
        page.click("#btn-sound")  # a real (trusted) mouse click: a user gesture
        off = poll_page(page, sound, "sound off again", lambda s: s["muted"])
        assert off["pressed"] == "false" and off["soundOn"] is False


def test_the_sound_button_plays_the_hls_streams_aac_too(request: pytest.FixtureRequest,
                                                         tmp_path: Path) -> None:
    """On HLS (chosen on the page, or a fallback) the same button unmutes the AAC track."""
    if not in_browser_netns(request):
        return
    with running_server(tmp_path) as server, chromium() as browser:
        page = browser.new_page()
        page.add_init_script("sessionStorage.setItem('ruseon.transport', 'hls');")
        page.goto(server.url)
        poll_page(page, sound, "HLS with its sound offered",
                  lambda s: s["audio"] and not s["hidden"], timeout_s=60)
        assert page.evaluate("window.ruseonHls.mode") == "hls"
        assert sound(page)["muted"] is True
        page.click("#btn-sound")
        on = poll_page(page, sound, "sound on", lambda s: s["soundOn"] and not s["muted"])
        assert on["pressed"] == "true"
        decoded = "document.getElementById('video').webkitAudioDecodedByteCount"
        first = page.evaluate(decoded)
        poll_page(page, lambda p: {"bytes": p.evaluate(decoded)}, "AAC being decoded",
                  lambda s: s["bytes"] > first + 8_000)
