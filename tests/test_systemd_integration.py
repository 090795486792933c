"""The systemd integration without systemd: real AF_UNIX sockets stand where systemd would listen.

The container test (tests/e2e/test_systemd.py) checks the same code against a real systemd.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ruseon_appliance import systemd_integration as sdi
from ruseon_appliance.systemd_integration import SystemdNotifier

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def notify_sock(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket bound where $NOTIFY_SOCKET would point."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    """Every datagram waiting on ``sock``, decoded."""
    out: list[str] = []
    sock.setblocking(False)
    try:
        while True:
            out.append(sock.recv(4096).decode())
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(5)
    return out


def test_datagram_path_sends_each_message(notify_sock: tuple[str, socket.socket]) -> None:
    path, sock = notify_sock
    notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": path})
    assert notifier.transport == "datagram"
    assert notifier.ready() and notifier.status("3 viewers\n30 fps") and notifier.stopping()
    assert [sock.recv(4096).decode() for _ in range(3)] == [
        "READY=1", "STATUS=3 viewers 30 fps", "STOPPING=1"
    ]
    notifier.close()


def test_abstract_notify_socket() -> None:
    name = f"ruseon-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": "@" + name})
        assert notifier.ready()
        assert sock.recv(64) == b"READY=1"
        notifier.close()


def test_without_systemd_everything_is_a_quiet_no_op() -> None:
    notifier = SystemdNotifier.from_environment({})
    assert notifier.transport == "none"
    assert not notifier.ready()
    assert not notifier.watchdog_enabled
    assert notifier.passed_sockets() == {}


def test_notify_failure_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert not notifier.ready()
    assert "READY=1" in caplog.text


def test_transport_is_logged(notify_sock: tuple[str, socket.socket],
                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    SystemdNotifier.from_environment({"NOTIFY_SOCKET": notify_sock[0]})
    assert "python3-systemd not available, sending datagrams to" in caplog.text


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "15000000"}, 15_000_000),
        ({"WATCHDOG_USEC": "15000000", "WATCHDOG_PID": str(os.getpid())}, 15_000_000),
        ({"WATCHDOG_USEC": "15000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_applies_only_to_our_pid(env: dict[str, str], expected: int | None) -> None:
    notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": "/nonexistent", **env})
    assert notifier.watchdog_usec == expected
    assert notifier.watchdog_enabled == (expected is not None)


async def test_watchdog_pings_only_while_healthy(
    notify_sock: tuple[str, socket.socket],
) -> None:
    path, sock = notify_sock
    # 0.2 s interval: a ping every 0.1 s.
    notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    healthy = True
    task = asyncio.create_task(notifier.watchdog_loop(lambda: healthy))
    while notifier.pings_sent < 3:
        await asyncio.sleep(0.02)
    healthy = False
    sent = notifier.pings_sent
    withheld = notifier.pings_withheld
    while notifier.pings_withheld < withheld + 3:
        await asyncio.sleep(0.02)
    # Nothing went out while unhealthy (at most one ping already in flight when we flipped).
    assert notifier.pings_sent <= sent + 1
    stalled_at = notifier.pings_sent
    healthy = True
    while notifier.pings_sent < stalled_at + 2:
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pings = [m for m in received(sock) if m == "WATCHDOG=1"]
    assert len(pings) == notifier.pings_sent


async def test_watchdog_withholds_after_a_blocked_loop(
    notify_sock: tuple[str, socket.socket],
) -> None:
    path, _ = notify_sock
    notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    task = asyncio.create_task(notifier.watchdog_loop(lambda: True))
    while notifier.pings_sent < 1:
        await asyncio.sleep(0.02)
    # Block the loop for several intervals: the late wake-up must not count as responsive.
    time.sleep(0.6)
    await asyncio.sleep(0)
    while notifier.pings_withheld < 1:
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_watchdog_loop_returns_without_watchdog() -> None:
    notifier = SystemdNotifier.from_environment({"NOTIFY_SOCKET": "/nonexistent"})
    await asyncio.wait_for(notifier.watchdog_loop(lambda: True), 1)


def test_frames_flowing_threshold() -> None:
    now = [100.0]
    last: list[float | None] = [None]
    healthy = sdi.frames_flowing(lambda: last[0], max_age_s=5.0, clock=lambda: now[0])
    assert not healthy()  # no frame yet
    last[0] = 99.0
    assert healthy()
    now[0] = 103.9
    assert healthy()
    now[0] = 104.0  # 5 s without a frame
    assert not healthy()


def test_listen_fds_parsing_requires_our_pid() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "http:rtc"}
    assert sdi.listen_fds_with_names(env) == {}
    assert "LISTEN_FDS" not in env  # unset either way
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "3", "LISTEN_FDNAMES": "http:rtc"}
    assert sdi.listen_fds_with_names(env, unset_environment=False) == {
        3: "http", 4: "rtc", 5: "unknown"
    }
    assert env["LISTEN_FDS"] == "3"


CHILD = textwrap.dedent(
    """
    import json, os, socket, sys
    from ruseon_appliance.systemd_integration import SystemdNotifier
    # Put the passed sockets where systemd puts them: fds 3 and 4.
    os.dup2(int(sys.argv[1]), 3)
    os.dup2(int(sys.argv[2]), 4)
    os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="2",
                      LISTEN_FDNAMES=sys.argv[3])
    socks = SystemdNotifier.from_environment(use_systemd_python=False).passed_sockets()
    out = {name: [s.fileno(), s.type == socket.SOCK_STREAM, s.getsockname()[1],
                  os.get_inheritable(s.fileno())] for name, s in socks.items()}
    out["env_left"] = [k for k in os.environ if k.startswith("LISTEN_")]
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("names", ["http:rtc", ""])
def test_passed_sockets_in_a_child_process(names: str) -> None:
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with tcp, udp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp.bind(("127.0.0.1", 0))
        # High fd numbers so dup2 onto 3 and 4 in the child cannot clobber them.
        hi_tcp, hi_udp = os.dup2(tcp.fileno(), 40), os.dup2(udp.fileno(), 41)
        try:
            result = subprocess.run(
                [sys.executable, "-c", CHILD, str(hi_tcp), str(hi_udp), names],
                pass_fds=(hi_tcp, hi_udp), capture_output=True, text=True, check=True,
                cwd=REPO, timeout=60,
            )
        finally:
            os.close(hi_tcp)
            os.close(hi_udp)
        out = json.loads(result.stdout)
        # Unnamed sockets are told apart by type.
        assert out["http"] == [3, True, tcp.getsockname()[1], False]
        assert out["rtc"] == [4, False, udp.getsockname()[1], False]
        assert out["env_left"] == []


def test_journal_entry_encoding_is_binary_safe() -> None:
    data = sdi.encode_journal_entry({"MESSAGE": "two\nlines", "EVENT": "x", "N": 3})
    assert data.startswith(b"MESSAGE\n" + (9).to_bytes(8, "little") + b"two\nlines\n")
    assert data.endswith(b"EVENT=x\nN=3\n")


def test_journal_datagram_handler_sends_structured_fields(tmp_path: Path) -> None:
    path = str(tmp_path / "journal")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
        journal.bind(path)
        journal.settimeout(5)
        handler = sdi.JournalDatagramHandler("ruseon-test", path)
        logger = logging.getLogger("ruseon.test.journal")
        logger.addHandler(handler)
        logger.propagate = False
        try:
            logger.warning("viewer %s joined", "abc",
                           extra={"SESSION_ID": "abc", "REMOTE_ADDR": "127.0.0.1", "EVENT": "join",
                                  "lower": "not a field"})
        finally:
            logger.removeHandler(handler)
            handler.close()
        fields = dict(line.split("=", 1) for line in journal.recv(65536).decode().splitlines())
    assert fields["MESSAGE"] == "viewer abc joined"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "ruseon-test"
    assert (fields["SESSION_ID"], fields["REMOTE_ADDR"], fields["EVENT"]) == (
        "abc", "127.0.0.1", "join"
    )
    assert "lower" not in fields


def test_journal_is_chosen_only_when_stderr_is_the_journal(tmp_path: Path) -> None:
    journal_socket = tmp_path / "journal"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
        journal.bind(str(journal_socket))
        st = os.fstat(sys.stderr.fileno())
        matching = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        other = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}
        handler, chosen = sdi.journal_handler(environ=matching, socket_path=str(journal_socket))
        assert handler is not None and chosen in ("journal", "journal-datagram")
        handler.close()
        assert sdi.journal_handler(environ=other, socket_path=str(journal_socket)) == (
            None, "stderr")
        assert sdi.journal_handler(environ={}) == (None, "stderr")
