"""The appliance on aarch64, end to end, under qemu-user emulation.

``image/build debian --arch arm64`` (cached by ``tests/prepare.d/image-arm64`` on its inputs:
the package list, the dependencies, ``image/``, ``systemd/``; scripts/test builds it in the
background while the rest of the suite runs, and these tests run last, waiting for it) installed
every dependency offline from aarch64 wheels downloaded on the host. Here, in an overlay over
that image, the project wheel from this checkout replaces the cached one. The appliance then
starts under systemd with the image's own ``ruseon.service`` (Type=notify, watchdog,
sandboxing), its process aarch64 code from the arm64 image, reaches READY, and an aiortc viewer
on the host decodes its stream over a veth pair into the device's own network namespace; the
decoder's first access unit must be a keyframe with SPS and PPS.

Why PID 1 is not the arm64 image's own systemd: systemd >= 256 as PID 1 does not run under
qemu-user (systemd issue #31219, open: qemu refuses the clone(CLONE_NEWNS) that credential and
namespace setup use). Booted here, the arm64 trixie image came up "degraded" with journald,
dbus and ruseon.service all failed with ``Result: resources``. So the container boots the amd64
trixie rootfs (native systemd 257, the same version), the arm64 image is bound at /srv/arm64,
and the unit runs with ``RootDirectory=/srv/arm64``: systemd sets up the sandbox natively, then
executes the image's aarch64 ``/opt/ruseon/bin/ruseon`` (through binfmt, hence the F flag).

Emulation makes everything on the aarch64 side ~10-20 times slower than natively, so the waits
here are generous; timings are printed and written to ``artifacts/arm64-e2e.json``, never
asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aioice.ice
import aiortc.rtcrtpreceiver
import pytest
from aiortc.codecs.h264 import H264Decoder

from tests import background_prepare
from tests.e2e import nspawn
from tests.e2e.whep_viewer import watch
from tests.tooling import IN_CI, require_root, require_tool

PREPARE = "image-arm64"
pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(1200),
              pytest.mark.background_prepare(PREPARE)]

ARCH = "arm64"
# 198.18.0.0/15 is reserved for benchmarking; the browser tests use 198.18.0.0/24.
HOST_ADDRESS, DEVICE_ADDRESS = "198.18.64.1", "198.18.64.2"
HOST_IF, DEVICE_IF = "ra64h", "ra64d"
HTTP_PORT, RTC_PORT = 8080, 8189
CLIP = nspawn.REPO / "tests/capture/data/cam_320x240_baseline.h264"
CLIP_IN_IMAGE = "/usr/local/share/ruseon-test/cam.h264"
ARM64_ROOT = "/srv/arm64"
# Emulated start-up (imports of numpy, av, aiortc, cryptography under qemu) on a loaded 2-core
# machine can pass the unit's 60 s; a board runs natively. Test-only drop-in.
UNIT_DROPIN = f"""[Service]
RootDirectory={ARM64_ROOT}
MountAPIVFS=yes
BindPaths=/run/systemd/journal
TimeoutStartSec=600
"""
SPS, PPS, IDR = 7, 8, 5
EM_AARCH64 = 0xB7  # ELF e_machine of AArch64
# Installed into the image from the locked wheels (requirements.lock), never built: the issue's
# list plus what they pull in. numpy too: the lock's wheel, not the OS's python3-numpy.
DEPENDENCIES = ("av", "aiortc", "aioice", "pylibsrtp", "cryptography", "aiohttp", "cffi",
                "google_crc32c", "pyopenssl", "numpy")
# Of those, the ones with native code: their wheels must be aarch64 builds.
NATIVE = ("av", "pylibsrtp", "cryptography", "aiohttp", "cffi", "google_crc32c", "numpy")


@dataclass
class Booted:
    """The booted container, the arm64 image its service runs from, and what was measured."""

    container: nspawn.Container
    rootfs: Path  # the arm64 image (overlay), bound at ARM64_ROOT in the container
    wheels: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{DEVICE_ADDRESS}:{HTTP_PORT}"


def service_config() -> str:
    """The file camera (no encoding under emulation), reachable only over the veth."""
    return (
        f'[camera]\nsource = "file:{CLIP_IN_IMAGE}"\nwidth = 320\nheight = 240\n'
        "framerate = 15\n"
        f'[http]\nlisten = "{DEVICE_ADDRESS}:{HTTP_PORT}"\n'
        f'[webrtc]\nlisten = "{DEVICE_ADDRESS}:{RTC_PORT}"\nadvertise = ["{DEVICE_ADDRESS}"]\n'
    )


def require_arm64_bench() -> Path:
    """Root, the tools, emulation and the cached arm64 image; fail in CI, skip elsewhere.
    A failed background preparation (scripts/test) fails, with its log, everywhere."""
    failed = background_prepare.failure(PREPARE)
    if failed:
        pytest.fail(failed, pytrace=False)
    require_root("mount overlayfs, make a network namespace and boot systemd-nspawn")
    for tool in ("systemd-nspawn", "nsenter", "unshare", "ip"):
        require_tool(tool, "scripts/install-system-deps")
    problem = nspawn.emulation_problem(ARCH)
    try:
        if problem:
            raise nspawn.PrepareError(f"arm64 emulation unavailable: {problem}")
        return nspawn.appliance_image(ARCH, build=False)
    except nspawn.PrepareError as exc:
        if IN_CI:
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@contextlib.contextmanager
def device_network() -> Iterator[Path]:
    """A network namespace for the device, joined to this one by a veth pair; yields its path.

    The namespace is held by a ``sleep`` in it (no /run/netns entry to leave behind)."""
    holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"])
    try:
        netns = Path(f"/proc/{holder.pid}/ns/net")
        ours = os.readlink("/proc/self/ns/net")

        def separate() -> bool:
            with contextlib.suppress(OSError):
                return os.readlink(netns) != ours
            return False

        nspawn.wait_for(separate, 10, "the device network namespace")
        inside = ["nsenter", f"--net={netns}", "--"]
        for command in (
            ["ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", DEVICE_IF],
            ["ip", "link", "set", DEVICE_IF, "netns", str(holder.pid)],
            ["ip", "addr", "add", f"{HOST_ADDRESS}/24", "dev", HOST_IF],
            ["ip", "link", "set", HOST_IF, "up"],
            [*inside, "ip", "addr", "add", f"{DEVICE_ADDRESS}/24", "dev", DEVICE_IF],
            [*inside, "ip", "link", "set", DEVICE_IF, "up"],
            [*inside, "ip", "link", "set", "lo", "up"],
        ):
            subprocess.run(command, check=True, capture_output=True)
        yield netns
    finally:
        subprocess.run(["ip", "link", "del", HOST_IF], check=False, capture_output=True)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)


def elf_machine(path: Path) -> int:
    """e_machine of an ELF file (little-endian)."""
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", path
    return int.from_bytes(header[18:20], "little")


def account(rootfs: Path, database: str, name: str) -> list[str]:
    """The ``name`` line of ``rootfs/etc/{passwd,group}``, split on ':'."""
    for line in (rootfs / "etc" / database).read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return fields
    raise AssertionError(f"no {name} in {rootfs}/etc/{database}")


def host_for_the_arm64_service(host: Path, arm64: Path) -> None:
    """The amd64 rootfs runs the arm64 image's unit, rooted in it, as the same ruseon user."""
    user = account(arm64, "passwd", "ruseon")
    group = account(arm64, "group", "ruseon")
    for database, line in (("group", ":".join(group[:3]) + ":"),
                           ("passwd", ":".join(user))):
        path = host / "etc" / database
        path.write_text(path.read_text() + line + "\n")
    units = host / "etc/systemd/system"
    (units / "ruseon.service").write_bytes((arm64 / "etc/systemd/system/ruseon.service"
                                            ).read_bytes())
    (units / "ruseon.service.d").mkdir(parents=True, exist_ok=True)
    (units / "ruseon.service.d/arm64-root.conf").write_text(UNIT_DROPIN)
    (units / "multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    (units / "multi-user.target.wants/ruseon.service").symlink_to(
        "/etc/systemd/system/ruseon.service")
    (host / ARM64_ROOT.lstrip("/")).mkdir(parents=True, exist_ok=True)
    # ConfigurationDirectory= (like StateDirectory=) comes from the host's side into the
    # RootDirectory= namespace, so the config is written there (0640 root:ruseon, as install.sh).
    config = host / "etc/ruseon/ruseon.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(service_config())
    os.chown(config, 0, int(group[2]))
    config.chmod(0o640)
    # Nothing else in the amd64 rootfs talks to the network or slows the boot.
    for unit in ("avahi-daemon.service", "avahi-daemon.socket", "ssh.service", "ssh.socket",
                 "apt-daily.timer", "apt-daily-upgrade.timer"):
        target = units / unit
        if not target.exists() and not target.is_symlink():
            target.symlink_to("/dev/null")


@pytest.fixture(scope="module")
def booted() -> Iterator[Booted]:
    image = require_arm64_bench()
    wheels = nspawn.wheels_dir(ARCH, build=False)
    overlay = nspawn.Overlay(image, "arm64")
    host = nspawn.Overlay(nspawn.base_rootfs(nspawn.HOST_ARCH, build=False), "arm64-host")
    timings: dict[str, float] = {}
    with contextlib.suppress(ValueError, OSError):
        timings["image_build_s"] = float((image / ".complete").read_text().split()[0])
    try:
        # This checkout's code over the cached image's. The project wheel is pure Python and its
        # dependencies are those of the cached image (they are in its key), so unpacking it over
        # the old one is what pip would do, without a minute of pip under emulation.
        wheel = nspawn.project_wheel(overlay.root / "dist")
        site = overlay.path / "opt/ruseon/lib/python3.13/site-packages"
        for old in [site / "ruseon_appliance", *site.glob("ruseon_appliance-*.dist-info")]:
            shutil.rmtree(old)
        with zipfile.ZipFile(wheel) as whl:
            whl.extractall(site)
        clip = overlay.path / CLIP_IN_IMAGE.lstrip("/")
        clip.parent.mkdir(parents=True, exist_ok=True)
        clip.write_bytes(CLIP.read_bytes())
        host_for_the_arm64_service(host.path, overlay.path)
        with device_network() as netns:
            began = time.monotonic()
            container = nspawn.Container(host.path, log_path=host.root / "console.log",
                                         netns=netns, binds=[(overlay.path, ARM64_ROOT)])
            try:
                state = container.wait_booted(timeout=900)
                timings["boot_s"] = time.monotonic() - began
                print(f"\n[arm64 e2e] boot to {state}: {timings['boot_s']:.1f} s")
                yield Booted(container, overlay.path, wheels, timings)
            finally:
                began = time.monotonic()
                journal = container.run("journalctl", "--no-pager", "-n", "300",
                                        check=False, timeout=120).stdout
                artifacts = nspawn.REPO / "artifacts"
                artifacts.mkdir(exist_ok=True)
                (artifacts / "arm64-e2e-journal.txt").write_text(journal)
                (artifacts / "arm64-e2e.json").write_text(json.dumps(timings, indent=1) + "\n")
                container.stop(timeout=120)
                print(f"\n[arm64 e2e] journal and shutdown: {time.monotonic() - began:.1f} s")
    finally:
        host.remove()
        overlay.remove()


def test_the_image_is_aarch64_and_runs_as_such(booted: Booted) -> None:
    assert elf_machine(booted.rootfs / "usr/bin/python3.13") == EM_AARCH64
    c = booted.container
    assert c.run("chroot", ARM64_ROOT, "uname", "-m", timeout=120).stdout.strip() == "aarch64"
    out = c.run("chroot", ARM64_ROOT, "/opt/ruseon/bin/python", "-c",
                "import platform, sys; print(platform.machine(), sys.version_info[:2])",
                timeout=300).stdout
    assert out.strip() == "aarch64 (3, 13)", out


def test_every_dependency_came_from_an_aarch64_or_pure_wheel(booted: Booted) -> None:
    """No sdist was available to build, no compiler is in the image, and every installed
    distribution's WHEEL tag is aarch64 or pure Python; the extensions are AArch64 code."""
    assert not [p.name for p in booted.wheels.iterdir()
                if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".whl")]
    for compiler in ("usr/bin/gcc", "usr/bin/cc", "usr/bin/aarch64-linux-gnu-gcc"):
        assert not (booted.rootfs / compiler).exists(), compiler
    site = booted.rootfs / "opt/ruseon/lib/python3.13/site-packages"
    installed: dict[str, list[str]] = {}
    for wheel_file in site.glob("*.dist-info/WHEEL"):
        name = wheel_file.parent.name.split("-")[0].lower()
        tags = [line.split(":", 1)[1].strip() for line in wheel_file.read_text().splitlines()
                if line.startswith("Tag:")]
        installed[name] = tags
    for name, tags in installed.items():
        assert tags and all(t.endswith("-any") or "aarch64" in t for t in tags), (name, tags)
    for name in DEPENDENCIES:
        assert name in installed, sorted(installed)
    for name in NATIVE:
        assert any("aarch64" in t for t in installed[name]), (name, installed[name])
    # Each installed distribution (but pip and the project) was one of the downloaded wheels.
    downloaded = {re.sub(r"[-_.]+", "_", p.name.split("-")[0].lower())
                  for p in booted.wheels.glob("*.whl")}
    for name in installed:
        if name not in ("pip", "ruseon_appliance"):
            assert re.sub(r"[-_.]+", "_", name) in downloaded, name
    numpy = site / "numpy"
    extensions = [*(site / "av").rglob("*.so"), *(site / "pylibsrtp").rglob("*.so"),
                  *numpy.rglob("*.so")]
    assert extensions and {elf_machine(p) for p in extensions} == {EM_AARCH64}


def test_the_appliance_reaches_ready_under_systemd(booted: Booted) -> None:
    c = booted.container

    def active() -> bool:
        state = c.show("ruseon", "ActiveState")["ActiveState"]
        assert state != "failed", c.run("journalctl", "-u", "ruseon", "--no-pager", "-n", "80",
                                        check=False, timeout=120).stdout
        return state == "active"

    nspawn.wait_for(active, 600, "ruseon.service active (READY=1) on aarch64", interval=1)
    props = c.show("ruseon", "Type", "NRestarts", "ExecMainStartTimestampMonotonic",
                   "ActiveEnterTimestampMonotonic", "MainPID", "RootDirectory", "User")
    assert props["Type"] == "notify"
    assert props["RootDirectory"] == ARM64_ROOT and props["User"] == "ruseon"
    # The service's process is aarch64 code: the kernel runs it through qemu-aarch64 (binfmt).
    exe = c.run("readlink", f"/proc/{props['MainPID']}/exe", timeout=120).stdout.strip()
    assert "qemu-aarch64" in exe or "aarch64-binfmt" in exe, exe
    cmdline = c.run("cat", f"/proc/{props['MainPID']}/cmdline", timeout=120).stdout
    assert "/opt/ruseon/bin/" in cmdline, cmdline
    started = (int(props["ActiveEnterTimestampMonotonic"])
               - int(props["ExecMainStartTimestampMonotonic"])) / 1e6
    booted.timings["service_start_to_ready_s"] = started
    booted.timings["service_restarts"] = float(props["NRestarts"])
    print(f"\n[arm64 e2e] ruseon.service start to READY (emulated): {started:.1f} s, "
          f"restarts {props['NRestarts']}")
    assert started > 0


class RecordingDecoder(H264Decoder):  # type: ignore[misc]
    """aiortc's H.264 decoder, remembering the NAL types of the first access unit it is fed."""

    instances: list[RecordingDecoder] = []

    def __init__(self) -> None:
        super().__init__()
        self.first_nal_types: list[int] | None = None
        RecordingDecoder.instances.append(self)

    def decode(self, encoded_frame: Any) -> list[Any]:
        if self.first_nal_types is None:
            data: bytes = encoded_frame.data
            self.first_nal_types = [data[i + 3] & 0x1F for i in range(len(data) - 3)
                                    if data[i:i + 3] == b"\x00\x00\x01"]
        return super().decode(encoded_frame)  # type: ignore[no-any-return]


async def test_a_viewer_on_the_host_decodes_the_stream_over_the_veth(
    booted: Booted, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aioice.ice, "get_host_addresses",
                        lambda use_ipv4, use_ipv6: [HOST_ADDRESS])
    original = aiortc.rtcrtpreceiver.get_decoder

    def get_decoder(codec: Any) -> Any:
        return RecordingDecoder() if codec.mimeType.lower() == "video/h264" else original(codec)

    monkeypatch.setattr(aiortc.rtcrtpreceiver, "get_decoder", get_decoder)
    RecordingDecoder.instances = []
    nspawn.wait_for(lambda: booted.container.show("ruseon", "ActiveState")["ActiveState"]
                    == "active", 600, "ruseon.service active", interval=1)
    began = time.monotonic()
    width, height, _ = await watch(booted.url, frames=10, timeout=180)
    booted.timings["viewer_first_10_frames_s"] = time.monotonic() - began
    assert (width, height) == (320, 240)
    (decoder,) = RecordingDecoder.instances
    first = decoder.first_nal_types or []
    assert SPS in first and PPS in first and IDR in first, first
    # The aarch64 service saw the viewer at the host's end of the veth.
    entries = booted.container.journal("-u", "ruseon")
    assert any(str(e.get("REMOTE_ADDR", "")).startswith(HOST_ADDRESS) for e in entries)
