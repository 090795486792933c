"""The device page in a real browser: Debian's Chromium, headless, driven by Playwright, against a
real ``ruseon serve`` with the synthetic source, all inside a private network namespace.

Each test re-runs itself in a fresh namespace (see :mod:`tests.e2e.browser_netns`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_netns import (
    ARTIFACTS,
    SOURCE_HEIGHT,
    SOURCE_WIDTH,
    chromium,
    inside_browser_netns,
    prepare_namespace,
    rerun_in_browser_netns,
    running_server,
    save_screenshot,
    wait_for_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FRAMES = 60


def playing(stats: dict[str, Any]) -> bool:
    return bool(stats["state"] == "live" and stats["framesDecoded"] > FRAMES)


def assert_plays_the_source(page: Any, server_status: dict[str, Any]) -> dict[str, Any]:
    """The page plays: more than 60 frames decoded, the source's size, H.264."""
    stats = wait_for_page(page, f"live with more than {FRAMES} frames decoded", playing)
    source = server_status["source"]
    assert (source["width"], source["height"]) == (SOURCE_WIDTH, SOURCE_HEIGHT)
    assert (stats["videoWidth"], stats["videoHeight"]) == (source["width"], source["height"])
    assert stats["codec"] == "video/H264"
    return stats


def test_device_page_plays_the_stream(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not inside_browser_netns():
        rerun_in_browser_netns(request.node.nodeid)
        return
    prepare_namespace()
    with running_server(tmp_path) as server, chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        opened = time.monotonic()
        page.goto(server.url)
        wait_for_page(page, "the first decoded frame", lambda s: s["framesDecoded"] > 0)
        # Recorded, not asserted (shared machine): how soon the picture appears.
        first_frame_s = time.monotonic() - opened
        assert_plays_the_source(page, server.status())
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "browser-first-frame.json").write_text(
            json.dumps({"page_open_to_first_decoded_frame_s": round(first_frame_s, 3)})
        )
        # The overlay shows what getStats says (the stats tick runs once a second).
        page.wait_for_function(
            "document.getElementById('stat-resolution').textContent.includes('\\u00d7')"
        )
        page.wait_for_function("document.getElementById('stat-viewers').textContent === '1'")
        assert page.text_content("#state-text") == "Live"
        save_screenshot(page, "browser-device-page.png")
        phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
        phone.goto(server.url)
        wait_for_page(phone, "live on a phone-sized page", playing)
        save_screenshot(phone, "browser-device-page-phone.png")


def test_three_pages_play_at_once(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not inside_browser_netns():
        rerun_in_browser_netns(request.node.nodeid)
        return
    prepare_namespace()
    with running_server(tmp_path) as server, chromium() as browser:
        pages = [browser.new_context().new_page() for _ in range(3)]
        for page in pages:
            page.goto(server.url)
        status = server.status()
        for page in pages:
            assert_plays_the_source(page, status)
        assert server.status()["viewers"]["count"] == 3


def test_page_reconnects_by_itself_after_a_server_restart(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if not inside_browser_netns():
        rerun_in_browser_netns(request.node.nodeid)
        return
    prepare_namespace()
    with chromium() as browser:
        server_cm = running_server(tmp_path)
        server = server_cm.__enter__()
        try:
            page = browser.new_page()
            page.goto(server.url)
            before = assert_plays_the_source(page, server.status())

            server.stop()
            wait_for_page(page, "noticing the server went away",
                          lambda s: s["state"] != "live", timeout_s=60)
            server.start()  # same ports and state directory, as systemd would restart it

            after = wait_for_page(
                page, "a new connection playing again",
                lambda s: s["generation"] > before["generation"] and playing(s), timeout_s=90,
            )
            assert after["codec"] == "video/H264"
            assert server.status()["viewers"]["count"] == 1
        finally:
            server_cm.__exit__(None, None, None)


def test_page_asks_for_the_token_and_remembers_it_for_the_tab(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if not inside_browser_netns():
        rerun_in_browser_netns(request.node.nodeid)
        return
    prepare_namespace()
    token = "correct-horse-battery-staple"
    with running_server(tmp_path, token=token) as server, chromium() as browser:
        page = browser.new_page()
        page.goto(server.url)
        page.wait_for_selector("#token-dialog[open]")
        assert page.text_content("#state-text") == "Locked"
        save_screenshot(page, "browser-token-prompt.png")

        page.fill("#token-input", "wrong")
        page.click("#token-form button[type=submit]")
        page.wait_for_function(
            "document.getElementById('token-hint').textContent.includes('not accepted')"
        )
        page.fill("#token-input", token)
        page.click("#token-form button[type=submit]")
        assert_plays_the_source(page, server.status())

        page.reload()  # same tab: sessionStorage still has the token, no prompt
        assert_plays_the_source(page, server.status())
        assert not page.is_visible("#token-dialog")
