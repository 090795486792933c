"""Debian's Firefox ESR driven headless over WebDriver BiDi, which Firefox speaks itself
(``--remote-debugging-port``): a small client over aiohttp's WebSocket, no geckodriver.

:class:`FirefoxPage` has the few methods of a Playwright page the browser tests use
(``goto``, ``evaluate``, ``wait_for_timeout``, ``screenshot``, ``add_init_script``), so the
helpers of :mod:`tests.e2e.browser_netns` (``poll_page``) work with it. Start it only inside the
test's private network namespace (:func:`tests.e2e.browser_netns.in_browser_netns`): the profile
turns Firefox's own background traffic off, and the namespace keeps whatever is left in.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hil.browser import call_source
from tests.tooling import IN_CI, free_port

FIREFOX = "/usr/bin/firefox-esr"
START_TIMEOUT_S = 60
COMMAND_TIMEOUT_S = 120  # a bound for a broken run on a starved machine, never a timing
# No background traffic (updates, telemetry, remote settings, safe browsing, the OpenH264
# download), and video may play by itself (the page's <video> is muted and autoplays anyway).
PREFS = {
    "app.update.enabled": False,
    "app.normandy.enabled": False,
    "browser.shell.checkDefaultBrowser": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
    "browser.safebrowsing.downloads.enabled": False,
    "browser.newtabpage.enabled": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "datareporting.healthreport.uploadEnabled": False,
    "toolkit.telemetry.enabled": False,
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "services.settings.server": "http://127.0.0.1:9/",
    "extensions.update.enabled": False,
    "media.gmp-manager.updateEnabled": False,
    "media.autoplay.default": 0,
    "media.autoplay.blocking_policy": 0,
}

# A download goes straight into the profile's downloads folder, never a question.
DOWNLOAD_PREFS = {
    "browser.download.folderList": 2,
    "browser.download.useDownloadDir": True,
    "browser.download.always_ask_before_handling_new_types": False,
    "browser.download.manager.showWhenStarting": False,
    "browser.download.start_downloads_in_tmp_dir": False,
    "browser.helperApps.neverAsk.saveToDisk": "video/mp4",
}


def require_firefox() -> None:
    """Skip (fail in CI) without Debian's firefox-esr."""
    if not Path(FIREFOX).exists():
        message = (f"{FIREFOX} is not installed "
                   "(scripts/install-system-deps: apt-get install firefox-esr)")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


class BidiError(RuntimeError):
    """An error answer to a BiDi command."""


class FirefoxPage:
    """One Firefox tab over WebDriver BiDi; every call waits at most COMMAND_TIMEOUT_S."""

    def __init__(self, loop: asyncio.AbstractEventLoop, socket: aiohttp.ClientWebSocketResponse,
                 context: str) -> None:
        self._loop = loop
        self._socket = socket
        self._context = context
        self._ids = itertools.count(1)
        self.console: list[str] = []  # what the page logged (console and errors), for failures
        # The messages of the page's alert/confirm/prompt dialogs, each accepted as it opened
        # (as a person clicking OK; :meth:`perform` may be what opened it).
        self.prompts: list[str] = []
        self.downloads = Path()  # where downloads are saved (set by :func:`firefox`)

    def _run(self, coroutine: Any) -> Any:
        return self._loop.run_until_complete(asyncio.wait_for(coroutine, COMMAND_TIMEOUT_S))

    async def _command(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        number = next(self._ids)
        await self._socket.send_json({"id": number, "method": method, "params": params})
        while True:
            message = await self._socket.receive()
            if message.type != aiohttp.WSMsgType.TEXT:
                raise BidiError(f"the BiDi socket closed during {method}: {message}")
            data = json.loads(message.data)
            if data.get("type") == "event":
                await self._note_event(data)
                continue
            if data.get("id") != number:
                continue
            if data.get("type") == "error":
                raise BidiError(f"{method}: {data.get('error')}: {data.get('message')}")
            result: dict[str, Any] = data["result"]
            return result

    async def _note_event(self, event: dict[str, Any]) -> None:
        if event.get("method") == "log.entryAdded":
            entry = event["params"]
            self.console.append(f"{entry.get('level')}: {entry.get('text')}")
        elif event.get("method") == "browsingContext.userPromptOpened":
            # Answered at once, not awaited: the command that opened it (a click) may only
            # finish once the dialog is closed; its answer is skipped by id.
            self.prompts.append(event["params"].get("message", ""))
            await self._socket.send_json({
                "id": next(self._ids), "method": "browsingContext.handleUserPrompt",
                "params": {"context": event["params"]["context"], "accept": True}})

    def command(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send one BiDi command and return its result (events met meanwhile are noted)."""
        result: dict[str, Any] = self._run(self._command(method, params))
        return result

    def goto(self, url: str, wait_until: str = "complete") -> None:
        """Navigate and wait for ``wait_until`` ("none", "interactive" or "complete")."""
        self.command("browsingContext.navigate",
                     {"context": self._context, "url": url, "wait": wait_until})

    def reload(self) -> None:
        """Reload and wait for the load event."""
        self.command("browsingContext.reload", {"context": self._context, "wait": "complete"})

    def add_init_script(self, script: str) -> None:
        """Run ``script`` in every document before the page's own scripts."""
        self.command("script.addPreloadScript", {
            "functionDeclaration": f"() => {{ {script} }}", "contexts": [self._context]})

    def evaluate(self, source: str) -> Any:
        """The value (as JSON) of a function's source (called) or of an expression."""
        result = self.command("script.evaluate", {
            "expression": call_source(source), "target": {"context": self._context},
            "awaitPromise": True, "resultOwnership": "none"})
        if result.get("type") == "exception":
            details = result.get("exceptionDetails", {})
            raise BidiError(f"script threw: {details.get('text')}")
        return json.loads(result["result"]["value"])

    def wait_for_timeout(self, ms: float) -> None:
        """Let the page run for ``ms`` (the socket is read meanwhile: its events)."""
        self._loop.run_until_complete(asyncio.sleep(ms / 1000))
        self._run(self._command("session.status", {}))  # the events that came meanwhile

    def perform(self, actions: list[dict[str, Any]]) -> None:
        """WebDriver input actions (pointer, key), dispatched as real input events."""
        self.command("input.performActions", {"context": self._context, "actions": actions})

    def screenshot(self, path: str) -> None:
        """A PNG of the viewport."""
        data = self.command("browsingContext.captureScreenshot", {"context": self._context})
        Path(path).write_bytes(base64.b64decode(data["data"]))


@contextlib.contextmanager
def firefox() -> Iterator[FirefoxPage]:
    """A headless Firefox ESR with a fresh profile and one tab (:class:`FirefoxPage`); the
    browser and its profile are gone on exit, whatever happened."""
    require_firefox()
    profile = Path(tempfile.mkdtemp(prefix="ruseon-firefox-"))
    downloads = profile / "downloads"
    downloads.mkdir()
    prefs = {**PREFS, **DOWNLOAD_PREFS, "browser.download.dir": str(downloads)}
    (profile / "user.js").write_text("".join(
        f'user_pref("{name}", {json.dumps(value)});\n' for name, value in prefs.items()))
    port = free_port()
    env = {**os.environ, "HOME": str(profile), "MOZ_CRASHREPORTER_DISABLE": "1"}
    proc = subprocess.Popen(
        [FIREFOX, "--headless", "--no-remote", "--profile", str(profile),
         f"--remote-debugging-port={port}", "about:blank"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    loop = asyncio.new_event_loop()
    session: aiohttp.ClientSession | None = None
    try:
        session, socket = loop.run_until_complete(asyncio.wait_for(
            _connect(port, proc), START_TIMEOUT_S))
        page = FirefoxPage(loop, socket, "")
        page.downloads = downloads
        # Dialogs stay open until answered (BiDi's default dismisses them at once).
        page.command("session.new", {"capabilities": {"alwaysMatch": {
            "unhandledPromptBehavior": {"default": "ignore"}}}})
        tree = page.command("browsingContext.getTree", {})
        page._context = tree["contexts"][0]["context"]
        page.command("session.subscribe", {"events": [
            "log.entryAdded", "browsingContext.userPromptOpened"]})
        yield page
    finally:
        if session is not None:
            loop.run_until_complete(session.close())
        loop.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


async def _connect(port: int, proc: subprocess.Popen[bytes]) -> tuple[
        aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
    """The BiDi WebSocket (ws://127.0.0.1:PORT/session), retried until Firefox listens."""
    session = aiohttp.ClientSession()
    while True:
        if proc.poll() is not None:
            await session.close()
            raise RuntimeError(f"firefox-esr exited with {proc.returncode} before BiDi answered")
        try:
            socket = await session.ws_connect(f"ws://127.0.0.1:{port}/session", max_msg_size=0)
            return session, socket
        except aiohttp.ClientError:
            await asyncio.sleep(0.2)
