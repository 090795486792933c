"""``/etc/ruseon/build-info`` (the image's commit and locked wheels) on ``/api/status``: the admin
sees it, a viewer with the viewer token and a stranger do not, not even its commit anywhere in
their answer. The file here is in the format image/layer/apply.sh writes (tests/e2e/test_image.py
checks the one a real build wrote)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ruseon_appliance import build_info
from tests.web.conftest import ADMIN

VIEWER_TOKEN = "viewer-token-for-the-build-info-test"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
BUILD_INFO = f"""\
# What this image was built from (image/layer/apply.sh); /api/status shows it to admin.
version = "0.1.0"
commit = "{COMMIT}"
commit_dirty = false
built = "2026-12-02T01:00:00Z"
arch = "arm64"
lock = "/usr/lib/ruseon/requirements.lock"
lock_sha256 = "{'ab' * 32}"

[packages]
aiortc = "1.16.0"
aioice = "0.13.0"
pylibsrtp = "1.0.0"
"""

Device = tuple[Any, Any, Any]


@pytest.fixture
def build_info_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "build-info"
    path.write_text(BUILD_INFO)
    monkeypatch.setattr(build_info, "BUILD_INFO", path)
    return path


@pytest.mark.parametrize("device", [{"auth": {"viewing": "credential",
                                              "viewer_token": VIEWER_TOKEN}}], indirect=True)
async def test_admin_sees_the_build_a_viewer_does_not(build_info_file: Path, device: Device,
                                                      ) -> None:
    _, _, client = device
    admin = await (await client.get("/api/status", headers=ADMIN)).json()
    assert admin["build"]["commit"] == COMMIT
    assert admin["build"]["packages"]["aiortc"] == "1.16.0"
    assert admin["build"]["arch"] == "arm64"
    response = await client.get("/api/status",
                                headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
    assert response.status == 200
    viewer = await response.json()
    assert viewer["access"]["role"] == "viewer"
    assert "build" not in viewer
    assert COMMIT not in await response.text()
    # Without a credential: refused outright.
    assert (await client.get("/api/status")).status == 401


@pytest.mark.parametrize("device", [{"auth": {"viewing": "open"}}], indirect=True)
async def test_a_stranger_on_an_open_device_does_not_see_the_build(build_info_file: Path,
                                                                   device: Device) -> None:
    _, _, client = device
    response = await client.get("/api/status")
    assert response.status == 200
    stranger = await response.json()
    assert stranger["access"]["role"] == "none"
    assert "build" not in stranger and COMMIT not in await response.text()
    assert (await (await client.get("/api/status", headers=ADMIN)).json())["build"]["commit"] == (
        COMMIT)


async def test_no_file_is_null_and_a_broken_one_says_why(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         device: Device) -> None:
    _, _, client = device
    monkeypatch.setattr(build_info, "BUILD_INFO", tmp_path / "missing")
    assert (await (await client.get("/api/status", headers=ADMIN)).json())["build"] is None
    broken = tmp_path / "broken"
    broken.write_text('commit = "unterminated\n')
    monkeypatch.setattr(build_info, "BUILD_INFO", broken)
    response = await client.get("/api/status", headers=ADMIN)
    assert response.status == 200
    assert str(broken) in (await response.json())["build"]["error"]
