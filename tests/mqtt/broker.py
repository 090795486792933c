"""Debian's mosquitto, started by a test on loopback (inside the test run's network namespace),
and a recording subscriber built on the same aiomqtt the appliance uses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiomqtt

from tests.tooling import require_tool


class Mosquitto:
    """One broker process; :meth:`restart` keeps the port (and, with persistence off, forgets
    every retained message, as a broker restarted without a persistence file does)."""

    def __init__(self, directory: Path, port: int, extra: str = "") -> None:
        """``extra``: more mosquitto.conf lines (e.g. a TLS listener)."""
        self.binary = require_tool("mosquitto", "apt-get install mosquitto")
        self.port = port
        self.conf = directory / "mosquitto.conf"
        # Started as root, mosquitto drops to its own user before it opens the log and loads
        # certificates, which live in the test's 0700 temporary directory: stay root.
        user = "user root\n" if os.geteuid() == 0 else ""
        self.conf.write_text(
            f"{user}listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"log_dest file {directory / 'mosquitto.log'}\n{extra}"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start and wait until the port accepts connections."""
        self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "mosquitto exited at start"
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.05)
        raise AssertionError("mosquitto did not start listening")

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL)."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port."""
        self.stop()
        self.start()


class Recorder:
    """Subscribes to ``topics`` and keeps every message: ``last[topic]`` and ``log``."""

    def __init__(self, port: int, topics: tuple[str, ...]) -> None:
        self.port = port
        self.topics = topics
        self.last: dict[str, aiomqtt.Message] = {}
        self.log: list[aiomqtt.Message] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def __aenter__(self) -> Recorder:
        self._task = asyncio.create_task(self._run_retrying())
        ready = asyncio.create_task(self._ready.wait())
        await asyncio.wait({ready, self._task}, timeout=60,
                           return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if self._task.done():
            self._task.result()  # raises what went wrong
        assert self._ready.is_set(), "the test's subscriber could not connect to mosquitto"
        return self

    async def _run_retrying(self) -> None:
        # A broker that has just (re)started may refuse a moment longer than its port suggests.
        for _ in range(100):
            try:
                await self._run()
            except aiomqtt.MqttError:
                if self._ready.is_set():
                    raise
                await asyncio.sleep(0.2)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
            await self._task

    async def _run(self) -> None:
        async with aiomqtt.Client("127.0.0.1", self.port) as client:
            for topic in self.topics:
                await client.subscribe(topic, qos=1)
            self._ready.set()
            async for message in client.messages:
                self.last[str(message.topic)] = message
                self.log.append(message)
                self._changed.set()

    async def wait_for(self, condition: Callable[[], Any], timeout: float = 60.0,
                       what: str = "") -> Any:
        """Wait until ``condition()`` is truthy (re-checked on every message); return it."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            result = condition()
            if result:
                return result
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {what or condition}; topics seen: "
                                     f"{sorted(self.last)}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
