"""WebKitGTK's MiniBrowser under Xvfb, driven by Debian's ``WebKitWebDriver`` (classic
WebDriver over HTTP, on loopback) with nothing but urllib.

:class:`WebKitPage` has the few methods of a Playwright page the browser tests use (``goto``,
``evaluate``, ``wait_for_timeout``, ``screenshot``), so :func:`tests.e2e.browser_netns.poll_page`
works with it. Start it only inside the test's private network namespace.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hil.browser import call_source
from tests.tooling import IN_CI, free_port

WEBDRIVER = "/usr/bin/WebKitWebDriver"
MINIBROWSER = "/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/MiniBrowser"
XVFB = "/usr/bin/Xvfb"
START_TIMEOUT_S = 60
COMMAND_TIMEOUT_S = 120  # a bound for a broken run on a starved machine, never a timing


def require_webkit() -> None:
    """Skip (fail in CI) without WebKitWebDriver, MiniBrowser and Xvfb."""
    for path, package in ((WEBDRIVER, "webkit2gtk-driver"), (MINIBROWSER, "webkit2gtk-driver"),
                          (XVFB, "xvfb")):
        if not Path(path).exists():
            message = (f"{path} is not installed "
                       f"(scripts/install-system-deps: apt-get install {package})")
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)


class WebDriverError(RuntimeError):
    """An error answer from WebKitWebDriver."""


class WebKitPage:
    """The one MiniBrowser window of a WebDriver session."""

    def __init__(self, base: str, downloads: Path) -> None:
        self._base = base  # http://127.0.0.1:PORT/session/ID
        self.downloads = downloads  # where downloads are saved (the XDG download folder)
        # The messages of the page's alert/confirm/prompt dialogs, each accepted (as a person
        # clicking OK) after the input that opened it.
        self.prompts: list[str] = []

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return webdriver_request(f"{self._base}{path}", method, body)

    def goto(self, url: str, wait_until: str = "load") -> None:
        """Navigate (WebDriver waits for the load)."""
        self._request("POST", "/url", {"url": url})

    def reload(self) -> None:
        """Reload and wait for the load."""
        self._request("POST", "/refresh", {})

    def evaluate(self, source: str) -> Any:
        """The value (as JSON) of a function's source (called) or of an expression."""
        script = ("const done = arguments[arguments.length - 1];"
                  f"{call_source(source)}.then(done, (e) => done(JSON.stringify("
                  "{__error: String(e && e.stack || e)})));")
        raw = self._request("POST", "/execute/async", {"script": script, "args": []})
        value = json.loads(raw) if isinstance(raw, str) else raw
        if isinstance(value, dict) and "__error" in value:
            raise WebDriverError(f"script threw: {value['__error']}")
        return value

    def wait_for_timeout(self, ms: float) -> None:
        """Let the page run for ``ms``."""
        time.sleep(ms / 1000)

    def perform(self, actions: list[dict[str, Any]]) -> None:
        """WebDriver input actions (pointer, key), dispatched as real input events; a dialog
        they opened is accepted."""
        self._request("POST", "/actions", {"actions": actions})
        try:
            text = self._request("GET", "/alert/text")
        except WebDriverError as error:
            if "no such alert" not in str(error):
                raise
            return
        self.prompts.append(str(text))
        self._request("POST", "/alert/accept", {})

    def screenshot(self, path: str) -> None:
        """A PNG of the window's viewport."""
        Path(path).write_bytes(base64.b64decode(self._request("GET", "/screenshot")))


def webdriver_request(url: str, method: str, body: dict[str, Any] | None = None) -> Any:
    """One WebDriver command; its ``value``, or :class:`WebDriverError` with the driver's words."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=COMMAND_TIMEOUT_S) as response:
            return json.load(response)["value"]
    except urllib.error.HTTPError as error:
        raise WebDriverError(f"{method} {url}: {error.code} {error.read()[:2000]!r}") from None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


# The session's capabilities: Debian's MiniBrowser, in automation mode.
CAPABILITIES = {"webkitgtk:browserOptions": {"binary": MINIBROWSER, "args": ["--automation"]}}


@contextlib.contextmanager
def webkit_webdriver() -> Iterator[tuple[str, Path]]:
    """``WebKitWebDriver`` on loopback with a fresh Xvfb display: its base URL (sessions with
    :data:`CAPABILITIES` open MiniBrowser) and the browser's download folder; driver and
    display are gone on exit, whatever happened."""
    require_webkit()
    home = Path(tempfile.mkdtemp(prefix="ruseon-webkit-"))
    downloads = home / "Downloads"
    downloads.mkdir()
    (home / ".config").mkdir()
    (home / ".config" / "user-dirs.dirs").write_text(f'XDG_DOWNLOAD_DIR="{downloads}"\n')
    read_end, write_end = os.pipe()
    xvfb = subprocess.Popen([XVFB, "-displayfd", str(write_end), "-screen", "0", "1280x800x24",
                             "-nolisten", "tcp"], pass_fds=(write_end,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    os.close(write_end)
    procs = [xvfb]
    try:
        with os.fdopen(read_end) as display_pipe:
            display = display_pipe.readline().strip()  # Xvfb writes it once it accepts clients
        if not display:
            raise RuntimeError("Xvfb did not start")
        port = free_port()
        env = {**os.environ, "DISPLAY": f":{display}", "HOME": str(home),
               "XDG_RUNTIME_DIR": str(home),
               # Xvfb has no GPU: with the DMA-BUF renderer the window stopped repainting once
               # the <video> played (screenshots showed the page as it was before), though
               # frames decoded. The shared-memory path paints.
               "WEBKIT_DISABLE_DMABUF_RENDERER": "1"}
        driver = subprocess.Popen([WEBDRIVER, f"--port={port}", "--host=127.0.0.1"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        procs.append(driver)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                webdriver_request(f"{base}/status", "GET")
                break
            except (OSError, WebDriverError):
                if driver.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("WebKitWebDriver did not start") from None
                time.sleep(0.2)
        yield base, downloads
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def webkit() -> Iterator[WebKitPage]:
    """MiniBrowser in a fresh Xvfb display, in a WebDriver session (:class:`WebKitPage`);
    session, browser, driver and display are gone on exit, whatever happened."""
    with webkit_webdriver() as (base, downloads):
        session_url = ""
        try:
            created = webdriver_request(f"{base}/session", "POST",
                                        {"capabilities": {"alwaysMatch": CAPABILITIES}})
            session_url = f"{base}/session/{created['sessionId']}"
            bound_ms = COMMAND_TIMEOUT_S * 1000
            webdriver_request(f"{session_url}/timeouts", "POST",
                              {"script": bound_ms, "pageLoad": bound_ms})
            yield WebKitPage(session_url, downloads)
        finally:
            if session_url:
                with contextlib.suppress(OSError, WebDriverError):
                    webdriver_request(session_url, "DELETE")
