"""The motion settings the page changes (sensitivity, detection on/off, zones) through
``PATCH /api/camera/<camera>/motion`` on a running appliance: checked (a clear 400 or 422 for
what does not fit, nothing applied), applied live to the detector, saved under the camera's
state folder and loaded again over the configuration's values after a restart; ``null``
returns a setting to the configuration's."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ruseon_appliance.app import Appliance
from ruseon_appliance.config import (
    AuthConfig,
    CameraConfig,
    Config,
    HlsConfig,
    HostPort,
    HttpConfig,
    StateConfig,
    WebRtcConfig,
)
from ruseon_appliance.motion.saved import MOTION_FILE
from ruseon_appliance.motion.zones import MAX_POINTS, MAX_ZONES, Zone, zones_from_json
from tests.tooling import free_port

TOKEN = "saved-motion-admin-secret-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
CONFIGURED_EXCLUDE = "0,0 0.2,0 0.2,0.2"
TRIANGLE = [[0.1, 0.1], [0.9, 0.1], [0.5, 0.8]]
EVERYTHING = [[0, 0], [1, 0], [1, 1], [0, 1]]


def test_zones_from_json_says_what_is_wrong() -> None:
    assert zones_from_json([{"points": TRIANGLE, "include": False}]) == (
        Zone(((0.1, 0.1), (0.9, 0.1), (0.5, 0.8)), False),)
    assert zones_from_json([{"points": "0,0 1,0 1,1"}])[0].include is True
    for bad, why in (
            ({"points": TRIANGLE}, "must be a list"),
            ([[0, 0]], "zone 1 is not an object"),
            ([{"points": TRIANGLE, "colour": "red"}], "unknown key colour"),
            ([{"points": TRIANGLE, "include": "yes"}], "include = 'yes'"),
            ([{"points": TRIANGLE[:2]}], "needs at least 3"),
            ([{"points": [[0, 0], [1, 0], [1.5, 1]]}], "point 3: [1.5, 1] is outside"),
            ([{"points": [[0, 0], [1, 0], [10 ** 400, 1]]}], "is outside"),
            ([{"points": [[0, 0], [1, 0], [True, 1]]}], "is not [x, y]"),
            ([{"points": [[0, 0], [1, 0], [1]]}], "is not [x, y]"),
            ([{"points": "0,0 1,0"}], "needs at least 3"),
            ([{"points": TRIANGLE}] * (MAX_ZONES + 1), f"at most {MAX_ZONES}"),
            ([{"points": [[0, 0]] * (MAX_POINTS + 1)}], f"at most {MAX_POINTS}")):
        with pytest.raises(ValueError) as caught:
            zones_from_json(bad)
        assert why in str(caught.value), (bad, caught.value)


def config_for(tmp_path: Path, port: int) -> Config:
    return Config(
        cameras=(CameraConfig(name="front", source="synthetic", width=160, height=96,
                              framerate=15, keyframe_interval=15, bitrate=200_000,
                              motion_sensitivity=40, motion_exclude=(CONFIGURED_EXCLUDE,)),),
        http=HttpConfig(listen=HostPort("127.0.0.1", port)),
        webrtc=WebRtcConfig(listen=HostPort("127.0.0.1", 0), advertise=("127.0.0.1",)),
        state=StateConfig(dir=str(tmp_path / "state")),
        auth=AuthConfig(token=TOKEN),
        hls=HlsConfig(enable=False),
    )


async def patch(http: aiohttp.ClientSession, url: str, body: Any, status: int = 200) -> Any:
    async with http.patch(url, json=body, headers=ADMIN) as response:
        doc = await response.json()
        assert response.status == status, (body, doc)
        return doc


async def test_settings_apply_live_are_saved_and_come_back_after_a_restart(
        tmp_path: Path) -> None:
    port = free_port()
    config = config_for(tmp_path, port)
    url = f"http://127.0.0.1:{port}/api/camera/front/motion"
    app = Appliance(config)
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url, headers=ADMIN) as response:
                before = await response.json()
            assert before["sensitivity"] == 40 and before["saved"] == []
            assert before["zones"] == [{"points": [[0, 0], [0.2, 0], [0.2, 0.2]],
                                        "include": False}]
            # Bad zones: a 400 naming the fault; nothing of the request applied.
            for bad, why in (([{"points": [[0, 0], [1, 0]]}], "needs at least 3"),
                             ([{"points": [[0, 0], [1, 0], [2, 2]]}], "outside the picture"),
                             ({"points": TRIANGLE}, "must be a list")):
                doc = await patch(http, url, {"zones": bad, "sensitivity": 90}, 400)
                assert doc["detail"].startswith("zones: ") and why in doc["detail"], doc
            await patch(http, url, {"sensitivity": 200, "zones": []}, 422)
            async with http.get(url, headers=ADMIN) as response:
                assert (await response.json())["sensitivity"] == 40
            async with http.patch(url, json={"zones": []}) as response:
                assert response.status == 401  # admin's

            # Live: an exclusion of the whole picture leaves nothing to look at (the synthetic
            # picture moves, so the score was above 0 before).
            motion = app.cameras.resolve("front").motion  # type: ignore[union-attr]
            assert motion is not None
            async with asyncio.timeout(30):
                while motion.meter()["score"] == 0:
                    await asyncio.sleep(0.1)
            doc = await patch(http, url, {"zones": [{"points": EVERYTHING, "include": False}]})
            assert doc["saved"] == ["zones"]
            analysed = motion.analyser.analysed
            async with asyncio.timeout(30):
                while motion.analyser.analysed < analysed + 3:
                    await asyncio.sleep(0.05)
            assert motion.meter()["score"] == 0.0

            doc = await patch(http, url, {"zones": [{"points": TRIANGLE, "include": True},
                                                    {"points": EVERYTHING, "include": False}],
                                          "sensitivity": 75, "enabled": False})
            assert doc["sensitivity"] == 75 and doc["enabled"] is False
            assert doc["saved"] == ["enabled", "sensitivity", "zones"]
            assert doc["threshold"] < before["threshold"]  # more sensitive: less is motion
    finally:
        await app.stop()
    saved = tmp_path / "state" / "cameras" / "front" / MOTION_FILE
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert json.loads(saved.read_text())["sensitivity"] == 75

    again = Appliance(config)
    await again.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url, headers=ADMIN) as response:
                doc = await response.json()
            assert doc["sensitivity"] == 75 and doc["enabled"] is False
            assert doc["zones"] == [{"points": TRIANGLE, "include": True},
                                    {"points": EVERYTHING, "include": False}]
            # null: back to the configuration's values (and no longer saved).
            doc = await patch(http, url, {"zones": None, "sensitivity": None,
                                          "enabled": None})
            assert doc["sensitivity"] == 40 and doc["enabled"] is True
            assert doc["zones"] == before["zones"] and doc["saved"] == []
    finally:
        await again.stop()
    assert json.loads(saved.read_text()) == {}


async def test_a_saved_file_that_does_not_parse_leaves_the_configured_values(
        tmp_path: Path) -> None:
    port = free_port()
    saved = tmp_path / "state" / "cameras" / "front" / MOTION_FILE
    saved.parent.mkdir(parents=True)
    saved.write_text('{"sensitivity": 500}')
    app = Appliance(config_for(tmp_path, port))
    await app.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"http://127.0.0.1:{port}/api/camera/front/motion", headers=ADMIN) as response:
            doc = await response.json()
        assert doc["sensitivity"] == 40 and doc["saved"] == []
    finally:
        await app.stop()
