"""The appliance under a real systemd: a Debian rootfs booted with systemd-nspawn.

The project is installed with ``systemd/install.sh`` exactly as on a board, from a wheel built
from this checkout. The container shares the test's (private) network namespace, so the WHEP
clients here talk to the service over loopback. One boot serves every test in this module; they
run in file order and build on each other (watchdog restart, then socket activation).
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aioice.ice
import pytest

from tests.e2e import nspawn
from tests.e2e.whep_viewer import watch
from tests.tooling import free_port

pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass
class Booted:
    """The booted container and the loopback ports the appliance was configured with."""

    container: nspawn.Container
    http_port: int
    rtc_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def service_config(http_port: int, rtc_port: int) -> str:
    """ruseon.toml for the test: synthetic camera, loopback only, small picture."""
    return (
        '[camera]\nsource = "synthetic"\nwidth = 320\nheight = 240\nframerate = 15\n'
        "keyframe_interval = 15\n"
        f'[http]\nlisten = "127.0.0.1:{http_port}"\n'
        f'[webrtc]\nlisten = "127.0.0.1:{rtc_port}"\nadvertise = ["127.0.0.1"]\n'
    )


def quiet_the_rootfs(rootfs: Path) -> None:
    """Mask what would talk beyond loopback or slow the boot (mDNS is tested by the image)."""
    units = rootfs / "etc/systemd/system"
    for unit in ("avahi-daemon.service", "avahi-daemon.socket", "systemd-networkd.service",
                 "systemd-resolved.service", "apt-daily.timer", "apt-daily-upgrade.timer"):
        target = units / unit
        if not target.exists() and not target.is_symlink():
            target.symlink_to("/dev/null")


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    """Overlay over the cached rootfs, install.sh, config, boot; shut down at the end."""
    nspawn.require_bench()
    overlay = nspawn.Overlay(nspawn.base_rootfs(build=False), "systemd")
    try:
        wheel = nspawn.project_wheel(overlay.root / "dist")
        output = nspawn.install_appliance(overlay.path, wheel, "--no-start")
        assert "install.sh: done" in output, output
        http_port, rtc_port = free_port(), free_port(socket.SOCK_DGRAM)
        (overlay.path / "etc/ruseon/ruseon.toml").write_text(service_config(http_port, rtc_port))
        quiet_the_rootfs(overlay.path)
        began = time.monotonic()
        container = nspawn.Container(overlay.path, log_path=overlay.root / "console.log")
        try:
            state = container.wait_booted()
            print(f"\n[systemd e2e] boot to {state}: {time.monotonic() - began:.1f} s")
            yield Booted(container, http_port, rtc_port)
        finally:
            journal = container.run("journalctl", "--no-pager", "-n", "300", check=False).stdout
            artifacts = nspawn.REPO / "artifacts"
            artifacts.mkdir(exist_ok=True)
            (artifacts / "systemd-e2e-journal.txt").write_text(journal)
            container.stop()
    finally:
        overlay.remove()


def http_get(url: str, timeout: float = 2) -> bytes | None:
    """Body of a 200 response, or None when nothing answers (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read()
            return body
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


def service_active(container: nspawn.Container) -> bool:
    return container.show("ruseon", "ActiveState")["ActiveState"] == "active"


def main_pid(container: nspawn.Container) -> int:
    return int(container.show("ruseon", "MainPID")["MainPID"])


# -- a WHEP client from outside the container ----------------------------------------------------


@pytest.fixture(autouse=True)
def loopback_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client peer gathers exactly one host candidate, 127.0.0.1."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


# -- 1. READY ordering ----------------------------------------------------------------------------


def test_unit_is_notify_with_watchdog(booted: Booted) -> None:
    props = booted.container.show("ruseon", "Type", "NotifyAccess", "WatchdogUSec", "Restart",
                                  "User", "SupplementaryGroups", "DevicePolicy")
    assert props == {
        "Type": "notify", "NotifyAccess": "main", "WatchdogUSec": "15s", "Restart": "on-failure",
        "User": "ruseon", "SupplementaryGroups": "video", "DevicePolicy": "closed",
    }


def test_active_only_after_ready(booted: Booted) -> None:
    """Restart and watch: while systemd says active, the page and frames are already there."""
    c = booted.container
    nspawn.wait_for(lambda: service_active(c), 60, "ruseon.service active after boot")
    c.systemctl("restart", "--no-block", "ruseon")
    observations: list[tuple[str, bool]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = c.show("ruseon", "ActiveState")["ActiveState"]
        body = http_get(booted.url + "/api/status", timeout=1)
        observations.append((state, body is not None))
        if state == "active" and len([o for o in observations if o[0] == "active"]) >= 3:
            break
        time.sleep(0.05)
    states = [s for s, _ in observations]
    assert "activating" in states, observations
    # systemd waited in "activating" for READY=1; once active, HTTP answered every time.
    assert all(serving for s, serving in observations if s == "active"), observations
    first_active = states.index("active")
    assert "activating" in states[:first_active]

    # The journal agrees: the service's own start-up lines precede systemd's "Started".
    invocation = invocation_id(c)
    entries = c.journal("-u", "ruseon")
    own = [e for e in entries if e.get("_SYSTEMD_INVOCATION_ID") == invocation]
    started = [e for e in entries if e.get("INVOCATION_ID") == invocation
               and str(e.get("MESSAGE", "")).startswith("Started ruseon")]
    assert own, "no log lines from the service's process"
    assert started, "no 'Started ruseon.service' line for this invocation"
    # The service logged (starting capture, engine, HTTP) before systemd called it started.
    assert int(str(own[0]["__MONOTONIC_TIMESTAMP"])) < int(
        str(started[-1]["__MONOTONIC_TIMESTAMP"])
    )
    props = c.show("ruseon", "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    assert int(props["ActiveEnterTimestampMonotonic"]) > int(
        props["ExecMainStartTimestampMonotonic"]
    )


def invocation_id(container: nspawn.Container) -> str:
    return container.show("ruseon", "InvocationID")["InvocationID"]


# -- 2. video from outside ---------------------------------------------------------------------


async def test_whep_client_outside_the_container_gets_video(booted: Booted) -> None:
    width, height, _ = await watch(booted.url)
    assert (width, height) == (320, 240)
    status = booted.container.show("ruseon", "StatusText")["StatusText"]
    assert re.search(r"fps", status), status


# -- 3. watchdog -------------------------------------------------------------------------------


async def test_sigstop_is_caught_by_the_watchdog_and_a_client_reconnects(booted: Booted) -> None:
    c = booted.container
    before = c.show("ruseon", "NRestarts", "MainPID")
    pid = int(before["MainPID"])
    stopped_at = time.monotonic()
    c.run("kill", "-STOP", str(pid))
    nspawn.wait_for(
        lambda: c.show("ruseon", "NRestarts")["NRestarts"] != before["NRestarts"], 60,
        "systemd to restart the stopped service",
    )
    nspawn.wait_for(
        lambda: service_active(c) and main_pid(c) not in (0, pid), 60, "the new process"
    )
    print(f"\n[systemd e2e] SIGSTOP to active again: {time.monotonic() - stopped_at:.1f} s")
    log = c.run("journalctl", "-u", "ruseon", "--no-pager", "-n", "60").stdout
    assert "Watchdog timeout" in log, log
    width, _, _ = await watch(booted.url)
    assert width == 320


# -- 4. socket activation --------------------------------------------------------------------------


def udp_inode(port: int) -> str | None:
    """Inode of the UDP socket bound to 127.0.0.1:``port`` (the netns is shared)."""
    with open("/proc/net/udp") as fh:
        for line in fh.readlines()[1:]:
            fields = line.split()
            if fields[1] == f"0100007F:{port:04X}":
                return fields[9]
    return None


async def test_socket_units_keep_the_udp_port_across_restart(booted: Booted) -> None:
    c = booted.container
    http_port, rtc_port = free_port(), free_port(socket.SOCK_DGRAM)
    # Loopback ports unique to the test instead of 80 and 8189; the config still names the old
    # ports, so video on the new ones proves the service took the passed sockets.
    for unit, directive, port in (("ruseon-http.socket", "ListenStream", http_port),
                                  ("ruseon-rtc.socket", "ListenDatagram", rtc_port)):
        dropin = c.rootfs / f"etc/systemd/system/{unit}.d"
        dropin.mkdir(parents=True, exist_ok=True)
        (dropin / "test-ports.conf").write_text(
            f"[Socket]\n{directive}=\n{directive}=127.0.0.1:{port}\n"
        )
    c.systemctl("daemon-reload")
    c.systemctl("stop", "ruseon")
    c.systemctl("enable", "--now", "ruseon-http.socket", "ruseon-rtc.socket")
    c.systemctl("start", "ruseon")
    base = f"http://127.0.0.1:{http_port}"
    width, _, _ = await watch(base)
    assert width == 320
    passed = c.run("journalctl", "-u", "ruseon", "--no-pager", "-n", "80").stdout
    assert "socket activation: fd 3 'http'" in passed or "'http' is TCP" in passed, passed

    inode = udp_inode(rtc_port)
    assert inode is not None
    old_pid = main_pid(c)
    c.systemctl("restart", "--no-block", "ruseon")
    seen: set[str | None] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen.add(udp_inode(rtc_port))
        if service_active(c) and main_pid(c) not in (0, old_pid):
            break
        time.sleep(0.05)
    seen.add(udp_inode(rtc_port))
    # Never unbound, and the same socket (inode) the whole time.
    assert seen == {inode}
    width, _, _ = await watch(base)
    assert width == 320


# -- 5. journald fields ------------------------------------------------------------------------


def test_journal_has_structured_fields(booted: Booted) -> None:
    entries = booted.container.journal("-u", "ruseon")
    with_session = [e for e in entries if "SESSION_ID" in e]
    assert with_session, "no journal entry carries SESSION_ID"
    assert any("REMOTE_ADDR" in e for e in entries), "no journal entry carries REMOTE_ADDR"
    events = {str(e["EVENT"]) for e in entries if "EVENT" in e}
    assert "ready" in events, events
    assert any(str(e.get("REMOTE_ADDR", "")).startswith("127.0.0.1") for e in entries)


def test_memory_and_tasks_are_within_the_unit_limits(booted: Booted) -> None:
    """Measure the service in the container (cgroup v1 hosts lack MemoryCurrent)."""
    c = booted.container
    pid = main_pid(c)
    status = c.run("cat", f"/proc/{pid}/status").stdout
    rss_kib = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    print(f"\n[systemd e2e] service RSS {rss_kib / 1024:.0f} MiB, {threads} threads")
    assert rss_kib * 1024 < 384 * 1024 * 1024 // 2, "RSS above half of MemoryMax"
    assert threads < 64 // 2, "threads above half of TasksMax"


def test_sigterm_exits_cleanly(booted: Booted) -> None:
    c = booted.container
    with contextlib.suppress(RuntimeError):
        c.systemctl("disable", "--now", "ruseon-http.socket", "ruseon-rtc.socket")
    c.systemctl("stop", "ruseon")
    props = c.show("ruseon", "ActiveState", "Result", "ExecMainStatus", "ExecMainCode")
    assert props["Result"] == "success", props
    assert props["ExecMainStatus"] == "0", props
