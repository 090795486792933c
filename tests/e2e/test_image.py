"""``image/build debian`` end to end: build the rootfs, drop a provisioning file on its boot
partition, boot it with systemd-nspawn, and check the first boot applied it and video flows.

The build reuses the systemd test's cached package rootfs (``--base``) and wheels (offline), so
it takes seconds, not minutes. The container shares the test's private network namespace.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aioice.ice
import pytest

from tests.e2e import nspawn
from tests.e2e.whep_viewer import WhepRefused, watch
from tests.tooling import free_port, require_tool

pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = nspawn.REPO
HOSTNAME = "ruseon-cam-7"
TOKEN = "t0ken-from-the-boot-partition"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyKeyForTheImageTestOnly0000000000 admin@ci"


@dataclass
class BootedImage:
    """The booted image and where its appliance listens."""

    container: nspawn.Container
    rootfs: Path
    http_port: int
    build_log: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def provisioning_file(http_port: int, rtc_port: int) -> str:
    """The ruseon.toml an admin drops on the boot partition."""
    return f"""\
# Provisioning for one camera (applied and deleted on first boot).
[device]
hostname = "{HOSTNAME}"
ssh_authorized_keys = ["{SSH_KEY}"]

[auth]
token = "{TOKEN}"

[camera]
source = "synthetic"
width = 320
height = 240
framerate = 15
keyframe_interval = 15

[http]
listen = "127.0.0.1:{http_port}"

[webrtc]
listen = "127.0.0.1:{rtc_port}"
advertise = ["127.0.0.1"]
"""


@pytest.fixture(scope="module")
def booted_image() -> Iterator[BootedImage]:
    """image/build debian into .cache/run, provisioning file, boot; removed at the end."""
    nspawn.require_bench()
    require_tool("shellcheck", "scripts/install-system-deps")
    run_root = nspawn.CACHE / "run"
    run_root.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="image-", dir=run_root))
    container: nspawn.Container | None = None
    try:
        wheel = nspawn.project_wheel(out / "dist")
        build = subprocess.run(
            [
                str(REPO / "image/build"), "debian",
                "--base", str(nspawn.base_rootfs(build=False)),
                "--wheel", str(wheel), "--wheels", str(nspawn.wheels_dir(build=False)),
                "--out", str(out), "--name", "rootfs",
            ],
            capture_output=True, text=True, timeout=600, check=False,
        )
        assert build.returncode == 0, build.stdout + build.stderr
        rootfs = out / "rootfs"
        http_port, rtc_port = free_port(), free_port(socket.SOCK_DGRAM)
        (rootfs / "boot/firmware/ruseon.toml").write_text(provisioning_file(http_port, rtc_port))
        container = nspawn.Container(rootfs, log_path=out / "console.log")
        container.wait_booted()
        yield BootedImage(container, rootfs, http_port, build.stdout)
    finally:
        if container is not None:
            container.stop()
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(autouse=True)
def loopback_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client peer gathers exactly one host candidate, 127.0.0.1."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


def test_build_reports_its_stages(booted_image: BootedImage) -> None:
    log = booted_image.build_log
    for stage in ("prerequisites for 'debian' are present", "applying the appliance layer",
                  "install.sh: done", "== done"):
        assert stage in log, log
    # The same install script a board runs put the appliance in place.
    assert (booted_image.rootfs / "opt/ruseon/bin/ruseon").exists()
    assert (booted_image.rootfs / "etc/systemd/system/multi-user.target.wants/ruseon.service"
            ).is_symlink()


def test_first_boot_applied_hostname_token_and_key(booted_image: BootedImage) -> None:
    c = booted_image.container
    boot = booted_image.rootfs / "boot/firmware"
    assert not (boot / "ruseon.toml").exists(), "the file with the token was left on the card"
    log = (boot / "ruseon-firstboot.log").read_text()
    assert "applied" in log and HOSTNAME in log, log
    assert TOKEN not in log
    assert c.run("hostname").stdout.strip() == HOSTNAME
    assert c.run("cat", "/etc/hostname").stdout.strip() == HOSTNAME
    stat = c.run("stat", "-c", "%a %U %G", "/etc/ruseon/ruseon.toml").stdout.split()
    assert stat == ["640", "root", "ruseon"]
    config = c.run("/opt/ruseon/bin/ruseon", "config", "--config", "/etc/ruseon/ruseon.toml")
    assert f'token = "{TOKEN}"' in config.stdout
    assert 'source = "synthetic"' in config.stdout
    assert SSH_KEY in c.run("cat", "/root/.ssh/authorized_keys").stdout
    assert c.systemctl("is-enabled", "avahi-daemon.service", check=False).stdout.strip() == (
        "enabled"
    )


async def test_service_serves_video_with_the_provisioned_token(
    booted_image: BootedImage,
) -> None:
    c = booted_image.container
    nspawn.wait_for(
        lambda: c.show("ruseon", "ActiveState")["ActiveState"] == "active", 60,
        "ruseon.service active",
    )
    with pytest.raises(WhepRefused) as refused:
        await watch(booted_image.url, frames=1)
    assert refused.value.status == 401
    width, height, _ = await watch(booted_image.url, token=TOKEN)
    assert (width, height) == (320, 240)


def test_an_invalid_file_is_set_aside_and_defaults_kept(booted_image: BootedImage) -> None:
    c = booted_image.container
    boot = booted_image.rootfs / "boot/firmware"
    before = c.run("cat", "/etc/ruseon/ruseon.toml").stdout
    (boot / "ruseon.toml").write_text("[camera]\nwidth = 17\n")
    c.systemctl("start", "ruseon-firstboot.service")
    assert (boot / "ruseon.toml.invalid").exists()
    assert not (boot / "ruseon.toml").exists()
    log = (boot / "ruseon-firstboot.log").read_text()
    assert "NOT applied" in log and "camera.width" in log, log
    assert c.run("cat", "/etc/ruseon/ruseon.toml").stdout == before


def test_image_scripts_are_shellcheck_and_yaml_clean() -> None:
    require_tool("shellcheck", "scripts/install-system-deps")
    subprocess.run(
        ["shellcheck", str(REPO / "image/build"), str(REPO / "image/layer/apply.sh"),
         str(REPO / "systemd/install.sh")],
        check=True,
    )
    yamllint = shutil.which("yamllint") or str(REPO / ".venv/bin/yamllint")
    subprocess.run([yamllint, "-s", "-c", str(REPO / "image/.yamllint"), str(REPO / "image/rpi")],
                   check=True)


def test_rpi_target_fails_early_with_instructions(tmp_path: Path) -> None:
    """Without rpi-image-gen (and on x86) the rpi target stops before building anything."""
    result = subprocess.run(
        [str(REPO / "image/build"), "rpi", "--rpi-image-gen", str(tmp_path / "absent")],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "prerequisites missing" in result.stderr
    assert "rpi-image-gen" in result.stderr and "https://github.com/raspberrypi/rpi-image-gen" in (
        result.stderr
    )
    assert "== building" not in result.stdout


def test_arm64_debian_target_follows_binfmt(tmp_path: Path) -> None:
    """arm64 builds where qemu-user binfmt is enabled, and says exactly how to enable it if not."""
    binfmt = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    available = os.uname().machine == "aarch64" or (
        binfmt.exists() and binfmt.read_text().startswith("enabled")
    )
    result = subprocess.run(
        [str(REPO / "image/build"), "check", "debian", "--arch", "arm64"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )
    if available and os.geteuid() == 0:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 1
        if not available:
            assert "qemu-user-static binfmt-support" in result.stderr, result.stderr
