"""The service's side of systemd: readiness, watchdog, status, passed sockets and journald logging.

The composition root (``app.py``) uses it like this::

    notifier = SystemdNotifier.from_environment()
    socks = notifier.passed_sockets()          # {"http": <tcp listener>, "rtc": <udp socket>}
    ...                                        # start HTTP, engine, wait for the first frame
    notifier.ready()
    asyncio.create_task(notifier.watchdog_loop(healthy))
    notifier.status("2 viewers, 30.0 fps, 2.01 Mbit/s")   # every few seconds
    notifier.stopping()                        # on SIGTERM, before closing sessions

Everything is a no-op when the process was not started by systemd, so the same calls work under
``python -m ruseon_appliance`` in a terminal.

Two transports for the notify protocol, chosen once and logged: ``systemd.daemon.notify`` from
python3-systemd when it is importable, else a plain datagram to ``$NOTIFY_SOCKET`` (a filesystem
path, or an abstract socket when it starts with ``@``). The datagram path is the whole protocol:
systemd reads ``KEY=VALUE`` lines from one datagram and checks the sender's credentials.

Watchdog threshold. With ``WatchdogSec=15`` systemd exports ``WATCHDOG_USEC=15000000``; the loop
pings every half of that (7.5 s). A ping is withheld when

* the event loop woke up late by more than a quarter of the interval (3.75 s): something blocked
  the loop, and a loop that is blocked for good sends nothing at all, or
* ``healthy()`` says no. The appliance's check (``app.py``) is that no camera's stop or start
  has hung for ``cameras.camera.STUCK_S`` (a driver thread that only a new process frees).

So a blocked loop or a hung camera driver stops the pings, and systemd kills and restarts the
service at most ``WatchdogSec`` after the last good ping. A camera that is missing, unplugged or
silent does not (issue 24): each camera is probed and restarted in-process with back-off and
reported (``/healthz``, the page, MQTT), since a service restart would not bring it back, would
cut every viewer, and every ~20 s would exhaust ``StartLimitBurst`` and leave the board down
until power-cycled. :func:`frames_flowing` (the newest access unit younger than
:data:`FRAME_STALL_SECONDS`) was the check before that and stays for callers that want it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from types import ModuleType
from typing import Any, Final

from .logs import context_fields

log = logging.getLogger(__name__)

#: A frame older than this makes :func:`frames_flowing` false and withholds watchdog pings.
FRAME_STALL_SECONDS: Final = 5.0

#: First passed file descriptor (``SD_LISTEN_FDS_START``).
LISTEN_FDS_START: Final = 3

#: Names the socket units give their sockets (``FileDescriptorName=``).
HTTP_SOCKET_NAME: Final = "http"
RTC_SOCKET_NAME: Final = "rtc"


def _import_systemd_daemon() -> ModuleType | None:
    """python3-systemd's ``systemd.daemon``, or None when it is not installed."""
    try:
        from systemd import daemon
    except ImportError:
        return None
    module: ModuleType = daemon
    return module


def frames_flowing(
    last_frame_monotonic: Callable[[], float | None],
    max_age_s: float = FRAME_STALL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], bool]:
    """A ``healthy()`` check for :meth:`SystemdNotifier.watchdog_loop`: a frame arrived recently.

    ``last_frame_monotonic`` returns ``time.monotonic()`` of the newest access unit (for example
    ``lambda: capture.last_frame_monotonic``), or None when no frame has arrived yet.
    """

    def healthy() -> bool:
        last = last_frame_monotonic()
        return last is not None and clock() - last < max_age_s

    return healthy


class SystemdNotifier:
    """Talks the sd_notify protocol and hands over the sockets systemd passed in.

    Build it with :meth:`from_environment`; the constructor takes the pieces explicitly so tests
    can point it at their own socket and environment.
    """

    def __init__(
        self,
        notify_socket: str | None,
        *,
        watchdog_usec: int | None = None,
        environ: MutableMapping[str, str] | None = None,
        daemon_module: ModuleType | None = None,
    ) -> None:
        self.notify_socket = notify_socket or None
        #: The watchdog interval in µs, or None when systemd runs no watchdog for this process.
        self.watchdog_usec = watchdog_usec
        self._environ: MutableMapping[str, str] = os.environ if environ is None else environ
        self._daemon = daemon_module
        self._sock: socket.socket | None = None
        self._passed: dict[str, socket.socket] | None = None
        self.pings_sent = 0
        self.pings_withheld = 0
        if self.notify_socket is None:
            self.transport = "none"
        elif self._daemon is not None:
            self.transport = "systemd-python"
        else:
            self.transport = "datagram"

    @classmethod
    def from_environment(
        cls,
        environ: MutableMapping[str, str] | None = None,
        *,
        use_systemd_python: bool = True,
    ) -> SystemdNotifier:
        """Read ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` and log the path taken.

        systemd-python's ``notify`` reads ``$NOTIFY_SOCKET`` itself, so ``environ`` other than
        ``os.environ`` forces the datagram path.
        """
        env: MutableMapping[str, str] = os.environ if environ is None else environ
        daemon = _import_systemd_daemon() if use_systemd_python and environ is None else None
        notifier = cls(
            env.get("NOTIFY_SOCKET"),
            watchdog_usec=_watchdog_usec(env),
            environ=env,
            daemon_module=daemon,
        )
        if notifier.transport == "none":
            log.info("systemd notify: not started by systemd (no NOTIFY_SOCKET), notifications off")
        elif notifier.transport == "systemd-python":
            log.info("systemd notify: using systemd.daemon.notify (python3-systemd)")
        else:
            log.info(
                "systemd notify: python3-systemd not available, sending datagrams to %s",
                notifier.notify_socket,
            )
        if notifier.watchdog_usec:
            log.info("systemd watchdog: %.1f s, pinging every %.1f s while the service is healthy",
                     notifier.watchdog_usec / 1e6, notifier.watchdog_usec / 2e6)
        return notifier

    # -- the notify protocol -------------------------------------------------------------------

    def notify(self, message: str) -> bool:
        """Send one notify message (``KEY=VALUE`` lines). False when not under systemd or failed."""
        if self.notify_socket is None:
            return False
        if self._daemon is not None:
            return bool(self._daemon.notify(message))
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message.encode("utf-8"), _notify_address(self.notify_socket))
        except OSError as exc:
            log.warning("systemd notify: sending %r failed: %s", message.split("\n", 1)[0], exc)
            return False
        return True

    def ready(self) -> bool:
        """``READY=1``: HTTP is listening, the engine is up and the first frame is in the ring."""
        return self.notify("READY=1")

    def status(self, text: str) -> bool:
        """``STATUS=``: one line shown by ``systemctl status``."""
        return self.notify("STATUS=" + text.replace("\n", " "))

    def stopping(self) -> bool:
        """``STOPPING=1``: shutdown has begun."""
        return self.notify("STOPPING=1")

    def watchdog_ping(self) -> bool:
        """``WATCHDOG=1``, unconditionally. Normally :meth:`watchdog_loop` decides when."""
        return self.notify("WATCHDOG=1")

    @property
    def watchdog_enabled(self) -> bool:
        """True when systemd expects watchdog pings from this process."""
        return self.notify_socket is not None and bool(self.watchdog_usec)

    async def watchdog_loop(
        self,
        healthy: Callable[[], bool],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Ping at half the watchdog interval while the loop is responsive and ``healthy()``.

        Returns at once when there is no watchdog; otherwise runs until cancelled.
        """
        if not self.watchdog_enabled or self.watchdog_usec is None:
            return
        period = self.watchdog_usec / 2e6
        lag_limit = self.watchdog_usec / 4e6
        stalled = False
        while True:
            asleep = clock()
            await asyncio.sleep(period)
            lag = clock() - asleep - period
            if lag > lag_limit:
                self.pings_withheld += 1
                log.warning("systemd watchdog: event loop woke %.1f s late, ping withheld", lag,
                            extra={"EVENT": "watchdog_withheld"})
                continue
            if not healthy():
                self.pings_withheld += 1
                if not stalled:
                    log.error("systemd watchdog: unhealthy (see the lines before), withholding "
                              "pings so systemd restarts the service",
                              extra={"EVENT": "watchdog_withheld"})
                stalled = True
                continue
            if stalled:
                log.info("systemd watchdog: healthy again, pinging",
                         extra={"EVENT": "watchdog_resumed"})
                stalled = False
            if self.watchdog_ping():
                self.pings_sent += 1

    # -- socket activation ---------------------------------------------------------------------

    def passed_sockets(self) -> dict[str, socket.socket]:
        """Sockets passed by systemd socket units, by ``FileDescriptorName=`` (``http``, ``rtc``).

        Empty when none were passed; then the service binds its own. Unnamed sockets are named by
        type: a stream socket is ``http``, a datagram socket is ``rtc``. Reads the environment once
        and unsets ``LISTEN_*`` so children do not inherit them.
        """
        if self._passed is not None:
            return dict(self._passed)
        named = self._listen_fds_with_names()
        passed: dict[str, socket.socket] = {}
        for fd, name in named.items():
            if not _is_socket(fd):
                log.warning("socket activation: fd %d %r is not a socket, ignored", fd, name)
                continue
            os.set_inheritable(fd, False)
            sock = socket.socket(fileno=fd)
            if name in ("", "unknown", "stored", "connection"):
                name = HTTP_SOCKET_NAME if sock.type == socket.SOCK_STREAM else RTC_SOCKET_NAME
            if name in passed:
                log.warning("socket activation: a second socket named %r (fd %d) is ignored",
                            name, fd)
                sock.close()
                continue
            passed[name] = sock
            log.info("socket activation: fd %d %r is %s %s", fd, name,
                     "TCP" if sock.type == socket.SOCK_STREAM else "UDP", _sockname(sock))
        self._passed = passed
        return dict(passed)

    def _listen_fds_with_names(self) -> dict[int, str]:
        # python3-systemd's listen_fds_with_names reads os.environ, so use it only with that.
        if self._daemon is not None and hasattr(self._daemon, "listen_fds_with_names") \
                and self._environ is os.environ:
            return dict(self._daemon.listen_fds_with_names(True))
        return listen_fds_with_names(self._environ)

    def close(self) -> None:
        """Close the datagram socket (passed sockets belong to their users)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def listen_fds_with_names(
    environ: MutableMapping[str, str], *, unset_environment: bool = True
) -> dict[int, str]:
    """``sd_listen_fds_with_names`` without libsystemd: ``{fd: name}`` from ``LISTEN_*``.

    Only honoured when ``LISTEN_PID`` is this process, as the protocol requires; a missing or
    short ``LISTEN_FDNAMES`` names the rest ``unknown``.
    """
    try:
        pid = int(environ.get("LISTEN_PID", ""))
        count = int(environ.get("LISTEN_FDS", ""))
    except ValueError:
        return {}
    names = environ.get("LISTEN_FDNAMES", "").split(":") if environ.get("LISTEN_FDNAMES") else []
    if unset_environment:
        for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            environ.pop(key, None)
    if pid != os.getpid() or count <= 0:
        return {}
    return {
        LISTEN_FDS_START + i: names[i] if i < len(names) else "unknown" for i in range(count)
    }


def _watchdog_usec(environ: Mapping[str, str]) -> int | None:
    """``WATCHDOG_USEC`` when it applies to this process (``WATCHDOG_PID`` unset or ours)."""
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid_text = environ.get("WATCHDOG_PID")
    if pid_text:
        try:
            if int(pid_text) != os.getpid():
                return None
        except ValueError:
            return None
    return usec if usec > 0 else None


def _notify_address(path: str) -> str | bytes:
    # An '@' prefix names a socket in the abstract namespace: a leading NUL byte on the wire.
    if path.startswith("@"):
        return b"\0" + path[1:].encode()
    return path


def _sockname(sock: socket.socket) -> str:
    try:
        return str(sock.getsockname())
    except OSError:
        return "?"


# -- logging ---------------------------------------------------------------------------------------


def stderr_is_journal(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``$JOURNAL_STREAM`` (``DEV:INODE``) names the file behind stderr."""
    env = os.environ if environ is None else environ
    dev_text, _, ino_text = env.get("JOURNAL_STREAM", "").partition(":")
    try:
        dev, ino = int(dev_text), int(ino_text)
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class JournalDatagramHandler(logging.Handler):
    """The journal's native protocol without python3-systemd: one datagram per record.

    Sends ``MESSAGE``, ``PRIORITY``, ``LOGGER``, ``SYSLOG_IDENTIFIER``, code location and every
    upper-case ``extra`` key (``SESSION_ID``, ``REMOTE_ADDR``, ``EVENT``, ...) as fields.
    """

    SOCKET_PATH: Final = "/run/systemd/journal/socket"

    def __init__(self, identifier: str = "ruseon", path: str = SOCKET_PATH) -> None:
        super().__init__()
        self.identifier = identifier
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def emit(self, record: logging.LogRecord) -> None:
        """Send ``record`` as one journal entry."""
        try:
            fields: dict[str, Any] = {
                "MESSAGE": self.format(record),
                "PRIORITY": _syslog_priority(record.levelno),
                "LOGGER": record.name,
                "SYSLOG_IDENTIFIER": self.identifier,
                "CODE_FILE": record.pathname,
                "CODE_LINE": record.lineno,
                "CODE_FUNC": record.funcName,
            }
            fields.update(structured_fields(record))
            self._sock.sendto(encode_journal_entry(fields), self.path)
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()
        super().close()


def encode_journal_entry(fields: Mapping[str, Any]) -> bytes:
    """Serialize fields in the journal's native format (binary-safe form for multi-line values)."""
    out = bytearray()
    for key, value in fields.items():
        data = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


def structured_fields(record: logging.LogRecord) -> Iterator[tuple[str, Any]]:
    """The record's journal fields: its context fields that are valid journal field names."""
    for key, value in context_fields(record).items():
        if value is None or key.startswith("_") or not all(c.isalnum() or c == "_" for c in key):
            continue
        yield key, value


def _syslog_priority(levelno: int) -> int:
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def journal_handler(
    identifier: str = "ruseon",
    *,
    environ: Mapping[str, str] | None = None,
    socket_path: str = JournalDatagramHandler.SOCKET_PATH,
) -> tuple[logging.Handler | None, str]:
    """The journald handler to use, and which one: ``(handler, "journal" | "journal-datagram")``,
    or ``(None, "stderr")`` when stderr is not the journal.

    When ``$JOURNAL_STREAM`` says stderr is the journal, records go to journald with structured
    fields (upper-case ``extra`` keys become fields): through ``systemd.journal.JournalHandler``
    when python3-systemd is there, else through :class:`JournalDatagramHandler`.
    """
    if not stderr_is_journal(environ) or not os.path.exists(socket_path):
        return None, "stderr"
    handler: logging.Handler
    try:
        from systemd.journal import JournalHandler
    except ImportError:
        handler, chosen = JournalDatagramHandler(identifier, socket_path), "journal-datagram"
    else:
        journal: logging.Handler = JournalHandler(SYSLOG_IDENTIFIER=identifier)
        handler, chosen = journal, "journal"
    # The journal stamps time, priority and identifier itself.
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler, chosen


LOG_PATHS: Final = {
    "journal": "journald via systemd.journal.JournalHandler",
    "journal-datagram": "journald via its native socket (python3-systemd not installed)",
    "stderr": "stderr",
}


def _is_socket(fd: int) -> bool:
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False
