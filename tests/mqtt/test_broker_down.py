"""A broker that never answers (it accepts TCP and says nothing) costs the stream nothing: the
appliance starts, frames flow without a gap, MQTT gives up on each attempt and backs off."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path

from ruseon_appliance.config import MqttConfig
from tests.web.test_controls import appliance_at, config_for


async def test_silent_broker_does_not_touch_streaming(tmp_path: Path) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        mqtt = MqttConfig(url=f"mqtt://127.0.0.1:{silent.getsockname()[1]}")
        config = dataclasses.replace(config_for(tmp_path), mqtt=mqtt)
        async with appliance_at(config) as (appliance, _, _):
            assert appliance.mqtt is not None
            reader = appliance.capture.ring.reader("next")
            seqs = []
            # Read until MQTT has given up at least once (its CONNACK wait is 5 s).
            while appliance.mqtt.stats()["disconnects"] < 1:
                view = await asyncio.wait_for(reader.next(), 10)
                seqs.append(view.seq)
            assert len(seqs) > 30
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and reader.overruns == 0
            assert appliance.mqtt.stats()["connected"] is False
            reader.close()
