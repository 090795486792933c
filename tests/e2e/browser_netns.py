"""A private network namespace Chromium can do WebRTC in, a real ``ruseon serve``, and Chromium.

Chromium gathers no ICE candidate from loopback, and none at all in a namespace with only ``lo``
and no default route. So each browser test re-runs itself under ``unshare --net`` (see
:func:`rerun_in_browser_netns`); inside, :func:`prepare_namespace` adds a veth pair with a test
address (198.18.0.0/15 is reserved for benchmarking) and a default route through it. Chromium then
offers an mDNS host candidate, its checks reach the server's 127.0.0.1 candidate, and the server
learns its address as peer-reflexive. No packet leaves the namespace: the veth's peer end is in
the same namespace and nothing listens on 198.18.0.2.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.tooling import IN_CI, free_port, require_root, require_tool, stop_process

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
NETNS_ENV = "RUSEON_BROWSER_NETNS"
VETH, VETH_PEER = "rbr0", "rbr1"
TEST_ADDRESS, TEST_GATEWAY = "198.18.0.1/24", "198.18.0.2"
# For the IPv6 test: a unique local address (RFC 4193) and a default route, as for IPv4.
TEST_ADDRESS6, TEST_GATEWAY6 = "fd00:7275:7365::1/64", "fd00:7275:7365::2"
# The synthetic source's size in browser tests: small enough for three decoders on two cores.
SOURCE_WIDTH, SOURCE_HEIGHT = 640, 360
READY_TIMEOUT_S = 90
# Playwright's own waits (goto, click, wait_for_*) default to 30 s. On a starved machine the
# page took longer than that to load (every CPU busy, the test at a lower priority: the server
# answered each static file after seconds and "load" came after more than 30 s). A bound for a
# broken run, not a timing: nothing asserts how long anything takes.
PAGE_TIMEOUT_MS = 120_000


def inside_browser_netns() -> bool:
    """True in the re-run child, inside its private namespace."""
    return os.environ.get(NETNS_ENV) == "1"


def rerun_in_browser_netns(nodeid: str) -> None:
    """Run the test ``nodeid`` again in a fresh network namespace; fail with its output if it
    fails there. Called by the test itself when :func:`inside_browser_netns` is false."""
    require_root("creates a network namespace with a veth pair for Chromium")
    unshare = require_tool("unshare", "apt-get install util-linux")
    require_tool("ip", "apt-get install iproute2")
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is not installed (apt-get install chromium)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, NETNS_ENV: "1"}
    command = [unshare, "--net", "--fork", "--", sys.executable, "-m", "pytest", nodeid,
               "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=", "--timeout=240"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    if result.returncode != 0:
        # The inner test's own assertion lines first, whole: the tail of a long output (a page's
        # console, a tool's log) can be all that is kept of it otherwise.
        reasons = [line for line in result.stdout.splitlines() if line.startswith("E ")][:200]
        pytest.fail("in the browser namespace:\n" + "\n".join(reasons) + "\n[...]\n"
                    f"{result.stdout[-8000:]}\n{result.stderr[-4000:]}", pytrace=False)


def in_browser_netns(request: pytest.FixtureRequest, *, ipv6: bool = False) -> bool:
    """A browser test's first line (``if not in_browser_netns(request): return``): True inside
    its private namespace, prepared (``ipv6``: see :func:`prepare_namespace`); outside, re-runs
    the test there (its outcome is the test's) and returns False."""
    if not inside_browser_netns():
        rerun_in_browser_netns(request.node.nodeid)
        return False
    prepare_namespace(ipv6=ipv6)
    return True


def _assert_private_namespace() -> set[str]:
    """The interfaces here; raises unless this is the private namespace (only ours)."""
    # Asked over netlink (if_nameindex), not via /sys/class/net, which shows the namespace sysfs
    # was mounted in rather than this process's.
    present = {name for _, name in socket.if_nameindex()}
    # Refuse to touch a namespace that has real interfaces: this must be the private one.
    if not present <= {"lo", VETH, VETH_PEER}:
        raise RuntimeError(f"not a private network namespace (interfaces: {sorted(present)})")
    return present


def prepare_namespace(*, ipv6: bool = False) -> None:
    """Bring up ``lo`` and a veth pair with a default route, in *this* (private) namespace;
    with ``ipv6``, an IPv6 address and default route on it too (Chromium then gathers IPv6)."""
    present = _assert_private_namespace()
    commands = [["ip", "link", "set", "lo", "up"]]
    if VETH not in present:
        commands += [
            ["ip", "link", "add", VETH, "type", "veth", "peer", "name", VETH_PEER],
            ["ip", "addr", "add", TEST_ADDRESS, "dev", VETH],
            ["ip", "link", "set", VETH, "up"],
            ["ip", "link", "set", VETH_PEER, "up"],
            ["ip", "route", "add", "default", "via", TEST_GATEWAY, "dev", VETH],
        ]
        if ipv6:
            commands += [
                # nodad: usable at once, not "tentative" for a second or two.
                ["ip", "-6", "addr", "add", TEST_ADDRESS6, "dev", VETH, "nodad"],
                ["ip", "-6", "route", "add", "default", "via", TEST_GATEWAY6, "dev", VETH],
            ]
    for command in commands:
        subprocess.run(command, check=True, capture_output=True)
    # The veths' IPv6 link-local addresses stay "tentative" (duplicate address detection) for a
    # second or two after the links come up. When they turn valid, Chromium sees a network
    # change and fails every request in flight with net::ERR_NETWORK_CHANGED: in CI the page's
    # later module scripts were lost that way and never ran. Start nothing before that.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tentative = subprocess.run(["ip", "-6", "addr", "show", "tentative"],
                                   capture_output=True, text=True).stdout
        if not tentative.strip():
            break
        time.sleep(0.05)


class Server:
    """A real ``python -m ruseon_appliance serve`` with the synthetic source on loopback."""

    def __init__(self, state_dir: Path, *, token: str = "",
                 extra_args: Sequence[str] = (), host: str = "127.0.0.1",
                 env: Mapping[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.token = token
        self.extra_args = list(extra_args)
        # RUSEON_* settings of this test, over the defaults below (e.g. a larger picture).
        self.extra_env = dict(env or {})
        # HTTP, the WebRTC port and the advertised candidate: 127.0.0.1, or ::1 for IPv6.
        self.host = host
        self.http_port = free_port()
        self.rtc_port = free_port(kind=socket.SOCK_DGRAM)
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.http_port}/"

    def start(self) -> None:
        """Start and wait for the ready line (the first frame is then in the ring)."""
        command = [
            sys.executable, "-m", "ruseon_appliance", "serve", "--config", "/dev/null",
            # --camera NAME=SOURCE flags in extra_args name every camera's source themselves.
            *(() if "--camera" in self.extra_args else ("--source", "synthetic")),
            "--http", self._listen(self.http_port),
            "--rtc", self._listen(self.rtc_port), "--advertise", self.host,
            "--state-dir", str(self.state_dir),
        ]
        if self.token:
            command += ["--token", self.token]
        command += self.extra_args
        # Only our settings: the service refuses unknown RUSEON_* variables (the test bench's
        # RUSEON_TEST_NETNS, our own NETNS_ENV).
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUSEON_")}
        env["RUSEON_CAMERA_WIDTH"] = str(SOURCE_WIDTH)
        env["RUSEON_CAMERA_HEIGHT"] = str(SOURCE_HEIGHT)
        env.update(self.extra_env)
        if self.token:
            # A test that gives a token means a board whose viewing needs it too.
            env["RUSEON_AUTH_VIEWING"] = "credential"
        self._ready.clear()
        self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        if not self._ready.wait(READY_TIMEOUT_S) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError("ruseon serve did not get ready:\n" + "".join(self.output))

    def _listen(self, port: int) -> str:
        return f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.output.append(line)
            if "ready: open" in line:
                self._ready.set()
        self._ready.set()  # it exited: stop waiting, start() reports the output

    def admin_secret(self) -> str:
        """``--token`` when given, else the secret the service made in its state dir."""
        return self.token or (self.state_dir / "admin-secret").read_text().strip()

    def stop(self) -> None:
        """SIGTERM and wait (the service closes every session on the way out)."""
        if self.proc is None:
            return
        stop_process(self.proc)
        self.proc = None

    def status(self) -> dict[str, Any]:
        """``/api/status`` as JSON, as the admin sees it (with the sessions)."""
        request = urllib.request.Request(self.url + "api/status")
        request.add_header("Authorization", f"Bearer {self.admin_secret()}")
        with urllib.request.urlopen(request, timeout=10) as response:
            document: dict[str, Any] = json.load(response)
            return document


@contextlib.contextmanager
def running_server(state_dir: Path, *, token: str = "", extra_args: Sequence[str] = (),
                   host: str = "127.0.0.1",
                   env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """A started :class:`Server` (``extra_args`` appended to ``serve``, ``env`` over its
    RUSEON_* defaults), stopped on exit."""
    server = Server(state_dir, token=token, extra_args=extra_args, host=host, env=env)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright (never a downloaded browser). Its pages wait up
    to PAGE_TIMEOUT_MS and note what went wrong on them (:func:`page_problems`)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield WatchedBrowser(browser)
        finally:
            browser.close()


# What went wrong on each page, by page (see watch_page); weakly, so closed pages go.
_PROBLEMS: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()


def watch_page(page: Any) -> None:
    """Give ``page`` the generous timeout and note its failed requests, its error answers for
    the page's own files and its script errors, for :func:`page_problems`."""
    problems = _PROBLEMS.setdefault(page, [])
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.on("requestfailed", lambda r: problems.append(f"{r.method} {r.url}: {r.failure}"))
    page.on("response", lambda r: problems.append(f"{r.request.method} {r.url}: {r.status}")
            if r.status >= 400 and "/static/" in r.url else None)
    page.on("pageerror", lambda error: problems.append(f"script error: {error}"))


def page_problems(page: Any) -> list[str]:
    """What :func:`watch_page` noted on ``page`` so far."""
    return list(_PROBLEMS.get(page, []))


# Which of the page's modules have run (each sets its window global) and which of its own files
# finished loading, when (ms after the page opened) and in how long (a file still loading has no
# entry yet). Twice (one CI run, one whole e2e run here) a module after device.js
# (hls-fallback.js, recordings.js) had not run while the picture was live, once for 90 s; this
# says which file stood still, next time.
PAGE_MODULES_JS = """() => ({
  modules: {device: !!window.ruseon, hls: !!window.ruseonHls,
            recordings: !!window.ruseonRecordings},
  files: performance.getEntriesByType('resource').filter(e => e.name.includes('/static/'))
    .map(e => `${e.name.split('/static/')[1]} ${Math.round(e.startTime)}+` +
              `${Math.round(e.duration)} ms`)})"""


def page_diagnostics(page: Any) -> str:
    """What went wrong on ``page`` and which of its modules ran, for a failure message."""
    try:
        modules = page.evaluate(PAGE_MODULES_JS)
    except Exception as exc:  # the page itself may be what broke
        modules = f"(page not readable: {exc})"
    return f"page problems {page_problems(page)}; {modules}"


class WatchedBrowser:
    """A Playwright browser whose new pages (and new contexts' pages) are watched (see
    :func:`watch_page`); anything else is the browser's own."""

    def __init__(self, browser: Any) -> None:
        self._browser = browser

    def new_page(self, **options: Any) -> Any:
        """``Browser.new_page``, watched."""
        page = self._browser.new_page(**options)
        watch_page(page)
        return page

    def new_context(self, **options: Any) -> Any:
        """``Browser.new_context``; each page it opens is watched."""
        context = self._browser.new_context(**options)
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        context.on("page", watch_page)
        return context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._browser, name)


def viewing_needs_a_credential(directory: Path, viewer_token: str) -> list[str]:
    """``serve`` arguments for ``[auth] viewing = "credential"`` with ``viewer_token`` (a config
    file written to ``directory``): watching then needs a login too."""
    path = directory / "viewing-credential.toml"
    path.write_text(f'[auth]\nviewing = "credential"\nviewer_token = "{viewer_token}"\n')
    return ["--config", str(path)]


def log_in(page: Any, server: Server, secret: str | None = None) -> None:
    """Log ``page``'s browser context in as the page's dialogs do (POST /api/session; the admin
    secret unless ``secret``): its session cookie then goes with every request. Call it before
    ``page.goto``, so the page starts logged in; for tests that are not about the login."""
    secret = server.admin_secret() if secret is None else secret
    response = page.request.post(server.url + "api/session", data={"secret": secret})
    assert response.ok, f"POST /api/session: {response.status} {response.text()}"


def wait_for_element(page: Any, selector: str) -> None:
    """Wait until ``selector`` is visible; fail naming what went wrong on the page otherwise
    (a module that never ran leaves its controls out: its request failed, or it threw)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(selector, state="visible")
    except PlaywrightTimeout:
        raise AssertionError(f"{selector} never showed; problems on the page: "
                             f"{page_problems(page) or 'none noted'}") from None


# What the page reports about its stream, read from the player's RTCPeerConnection.
PAGE_STATS_JS = """async () => {
  const p = window.ruseon;
  const v = document.getElementById('video');
  const out = {state: p ? p.state : null, generation: p ? p.generation : 0,
               videoWidth: v.videoWidth, videoHeight: v.videoHeight, framesDecoded: 0,
               codec: null, viewers: p ? p.viewers : null};
  if (!p || !p.pc) return out;
  const report = await p.pc.getStats();
  const byId = new Map();
  report.forEach((s) => byId.set(s.id, s));
  report.forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'video') {
      out.framesDecoded = s.framesDecoded || 0;
      const codec = s.codecId ? byId.get(s.codecId) : null;
      out.codec = codec ? codec.mimeType : null;
    }
  });
  return out;
}"""


def page_stats(page: Any) -> dict[str, Any]:
    """The page's player state, video size, frames decoded and codec."""
    stats: dict[str, Any] = page.evaluate(PAGE_STATS_JS)
    return stats


def wait_for_page(
    page: Any, condition: str, predicate: Any, timeout_s: float = 60
) -> dict[str, Any]:
    """Poll :func:`page_stats` until ``predicate(stats)``; fail naming ``condition`` otherwise.
    (The timeout only keeps a broken run from hanging; nothing here measures time.)"""
    return poll_page(page, page_stats, condition, predicate, timeout_s)


def poll_page(page: Any, read: Callable[[Any], dict[str, Any]], condition: str,
              predicate: Any, timeout_s: float = 60) -> dict[str, Any]:
    """Poll ``read(page)`` every 250 ms (page time) until ``predicate`` holds; fail naming
    ``condition`` with the last figures otherwise (the timeout only keeps a broken run from
    hanging)."""
    deadline = time.monotonic() + timeout_s
    stats = read(page)
    while not predicate(stats):
        if time.monotonic() > deadline:
            raise AssertionError(f"page never reached: {condition}; last stats {stats}; "
                                 f"{page_diagnostics(page)}")
        page.wait_for_timeout(250)
        stats = read(page)
    return stats


def save_screenshot(page: Any, name: str) -> Path:
    """Save a screenshot under artifacts/ (gitignored) and return its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path


LOSS_TABLE = "ruseon_browser_loss"


@contextlib.contextmanager
def udp_loss_from_port(port: int, percent: int) -> Iterator[None]:
    """Drop about ``percent`` % of the UDP datagrams sent from ``port`` (the server's WebRTC port,
    so: everything the server sends to the browser), with an nftables rule in *this* private
    namespace; removed on exit. The kernel has no netem; ``numgen random`` gives random loss.
    The rule sits where datagrams arrive, with UDP GSO sends cut in software first, so it drops
    datagrams, not whole batches (``tests/datagram_loss.py``)."""
    from tests.datagram_loss import LOSS_HOOK, segment_udp_in_software

    nft = require_tool("nft", "apt-get install nftables")
    _assert_private_namespace()
    segment_udp_in_software()
    commands = [
        [nft, "add", "table", "inet", LOSS_TABLE],
        [nft, "add", "chain", "inet", LOSS_TABLE, "out", LOSS_HOOK],
        [nft, "add", "rule", "inet", LOSS_TABLE, "out", "udp", "sport", str(port),
         "numgen", "random", "mod", "100", "<", str(percent), "counter", "drop"],
    ]
    for command in commands:
        subprocess.run(command, check=True, capture_output=True, text=True)
    try:
        yield
    finally:
        subprocess.run([nft, "delete", "table", "inet", LOSS_TABLE], check=False,
                       capture_output=True)


def udp_loss_dropped() -> int:
    """How many datagrams the loss rule has dropped so far (its nft counter)."""
    listing = subprocess.run(["nft", "-j", "list", "table", "inet", LOSS_TABLE], check=True,
                             capture_output=True, text=True).stdout
    for item in json.loads(listing)["nftables"]:
        for expression in item.get("rule", {}).get("expr", []):
            if "counter" in expression:
                packets: int = expression["counter"]["packets"]
                return packets
    raise AssertionError(f"no counter in the loss table: {listing}")


# The video receiver's RTP statistics and the sender reports it has seen, straight from Chromium's
# getStats(): the inbound-rtp (video) and the remote-outbound-rtp that the server's RTCP SRs feed.
STREAM_STATS_JS = """async () => {
  const p = window.ruseon;
  if (!p || !p.pc) return null;
  const report = await p.pc.getStats();
  let inbound = null;
  report.forEach((s) => { if (s.type === 'inbound-rtp' && s.kind === 'video') inbound = s; });
  if (!inbound) return null;
  let remoteOutbound = null;
  report.forEach((s) => {
    if (s.type === 'remote-outbound-rtp' && (s.localId === inbound.id || s.kind === 'video')) {
      remoteOutbound = s;
    }
  });
  const plain = (s) => (s ? JSON.parse(JSON.stringify(s)) : null);
  return {inbound: plain(inbound), remoteOutbound: plain(remoteOutbound)};
}"""


def stream_stats(page: Any) -> dict[str, Any]:
    """``{"inbound": inbound-rtp (video), "remoteOutbound": remote-outbound-rtp or None}``."""
    stats: dict[str, Any] | None = page.evaluate(STREAM_STATS_JS)
    if stats is None:
        raise AssertionError("the page has no inbound video stream in getStats()")
    return stats


def stream_window(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """What happened between two :func:`stream_stats` samples: counter deltas, the decoded frame
    rate over getStats' own timestamps, and the mean jitter-buffer delay of the frames emitted."""
    a, b = first["inbound"], last["inbound"]
    seconds = (b["timestamp"] - a["timestamp"]) / 1000

    def delta(name: str) -> float:
        return float(b.get(name, 0) - a.get(name, 0))

    emitted = delta("jitterBufferEmittedCount")
    return {
        "seconds": round(seconds, 3),
        "frames_decoded": int(delta("framesDecoded")),
        "decoded_fps": round(delta("framesDecoded") / seconds, 2) if seconds > 0 else None,
        "frames_dropped": int(delta("framesDropped")),
        "freezes": int(delta("freezeCount")),
        "plis": int(delta("pliCount")),
        "firs": int(delta("firCount")),
        "nacks": int(delta("nackCount")),
        "packets_lost": int(delta("packetsLost")),
        "packets_received": int(delta("packetsReceived")),
        "keyframes_decoded": int(delta("keyFramesDecoded")),
        "jitter_buffer_delay_ms": (
            round(1000 * delta("jitterBufferDelay") / emitted, 1) if emitted > 0 else None
        ),
    }


def inbound_totals(sample: dict[str, Any]) -> dict[str, Any]:
    """The cumulative inbound-rtp and remote-outbound-rtp figures worth keeping in artifacts."""
    inbound = sample["inbound"]
    names = ["framesReceived", "framesDecoded", "framesDropped", "keyFramesDecoded",
             "freezeCount", "totalFreezesDuration", "pauseCount", "pliCount", "firCount",
             "nackCount", "packetsReceived", "packetsLost", "jitter", "jitterBufferDelay",
             "jitterBufferEmittedCount", "framesPerSecond", "frameWidth", "frameHeight",
             "totalDecodeTime", "decoderImplementation"]
    totals: dict[str, Any] = {name: inbound.get(name) for name in names}
    emitted = inbound.get("jitterBufferEmittedCount") or 0
    totals["mean_jitter_buffer_delay_ms"] = (
        round(1000 * inbound.get("jitterBufferDelay", 0) / emitted, 1) if emitted else None
    )
    remote = sample["remoteOutbound"]
    totals["remote_outbound_rtp"] = None if remote is None else {
        name: remote.get(name)
        for name in ["remoteTimestamp", "reportsSent", "packetsSent", "bytesSent",
                     "roundTripTimeMeasurements", "totalRoundTripTime"]
    }
    return totals


def record_browser_stats(key: str, figures: dict[str, Any]) -> None:
    """Merge ``figures`` under ``key`` into artifacts/browser-stats.json (one file for all the
    browser tests' figures, so runs can be compared)."""
    merge_artifact("browser-stats.json", key, figures)


def merge_artifact(name: str, key: str, figures: dict[str, Any]) -> None:
    """Merge ``figures`` under ``key`` into the JSON document artifacts/``name`` (created, or
    started afresh when unreadable)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    try:
        document: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        document = {}
    document[key] = figures
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
