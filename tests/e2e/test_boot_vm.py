"""The amd64 disk image booted as a whole machine (qemu-system, UEFI), tested from the outside.

``image/build debian --disk`` (cached on its inputs by ``tests/prepare.d/disk-amd64``, which
scripts/test runs in the background; these tests run last and wait for it) is flashed the way a
user flashes a card (``bmaptool copy`` of the ``.img.xz`` with its ``.bmap``, after
``sha256sum -c``) onto a file that is then made 1 GiB larger than the image (a bigger card). A
``ruseon.toml`` goes onto its FAT boot partition (hostname, SSH key, Wi-Fi). Then qemu boots it
with UEFI firmware and user-mode networking; the test reaches it only through ports forwarded to
127.0.0.1 (HTTP, SSH, and one UDP port for WebRTC, the same number on both sides, which the
guest is told to advertise as 127.0.0.1). The guest reaches nothing: in scripts/test's network
namespace (loopback only) the network is unrestricted, because libslirp's ``restrict=on`` drops
every UDP datagram from the guest, WebRTC's replies included (tests/e2e/qemu_vm.py); run outside
such a namespace it is ``restrict=on`` and the WHEP check fails in CI, skips elsewhere.

What is checked: the image's own systemd reaches multi-user with no failed unit, first boot
applied the file (hostname, Wi-Fi keyfile, SSH key: a login with it works, and ``sudo ruseon
admin-secret`` prints the secret the service made, which then opens an admin route),
growfs grew the root partition and filesystem, ruseon.service is READY, the device page,
``/healthz``, ``/snapshot.jpg`` and HLS answer, an aiortc viewer decodes frames over WHEP, the
boot partition is mounted read-only and NetworkManager is the network stack. Then, recording
continuously all along, its power is cut (qemu SIGKILLed; the disk has no host cache) at random
moments of an open segment, ten times in a row (once when those ten passed for the same disk image
and test before: :func:`power_cut_plan`), and it boots again each time: nothing
closed is lost, the open segment loses at most ``recording.sync_interval_s`` and a fragment,
the root file system needed only its journal replay and the boot partition is not dirty. Then
the clock: the first-boot file names the LAN's NTP server (``[time] ntp``: the test's, at qemu's
host address, tests/e2e/sntp.py), which sets the clock; twice more the power is cut with NTP gone
and the machine boots with no usable real-time clock (qemu's set to 2020), so its time is what
systemd and timesyncd saved: once as a running board left it (seconds behind), once with the
card's saved time 400 days old. The service records behind its own archive, uncertain, until NTP
answers and timesyncd steps the clock; nothing is deleted and the run is re-timed. At the
end the ACPI power button shuts it down cleanly, the provisioning file is gone from the boot
partition and its log is there. Boot times are printed and written to
``artifacts/boot-vm-amd64.json``, never asserted (a shared machine; emulation).

Inside-the-guest facts come from a report unit the test passes as a systemd credential (see
tests/e2e/qemu_vm.py); the image is not modified for the test.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aioice.ice
import pytest

from tests import background_prepare
from tests.e2e import nspawn, qemu_vm
from tests.e2e.sntp import SntpServer
from tests.e2e.whep_viewer import watch
from tests.segmenter.stream import ffmpeg_errors, probe_frames
from tests.tooling import IN_CI, free_port, require_root

PREPARE = "disk-amd64"
ARCH = "amd64"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),
              pytest.mark.background_prepare(PREPARE)]

HOSTNAME = "cam-vm-1"
WIFI_SSID = "Test Net 5"
WIFI_PSK = "correct horse battery staple"
IMAGE_USER = "pi"
GROW_BY = 1 << 30
# Power cuts while recording (continuous, segments of SEGMENT_S): how many in a row (each one
# is a boot, a few minutes under emulation), and the slack on "a cut loses at most
# sync_interval_s and a fragment": between a fragment's arrival and its fdatasync reaching the
# disk, on an emulated machine sharing 2 cores.
SEGMENT_S = 20
# Ten cuts in a row (each a boot under emulation: 80 s on a quiet machine, 180 s in a loaded
# clean-clone run) when the machine or this test changed: the disk image's cache key (its
# inputs) and this file; else one, and the record of the last ten-cut run of the same inputs
# (.cache/power-cuts/) stands for the rest. A clean clone has no record: CI (CI=true) cuts ten
# times, or as many as POWER_CUT_BUDGET_S allows and at least POWER_CUTS_MIN (ten took 30 min
# of a 43 min run: the suite's budget is 20). RUSEON_VM_POWER_CUTS=N forces N,
# RUSEON_VM_POWER_CUT_BUDGET_S the budget.
POWER_CUTS_FULL = 10
POWER_CUTS_MIN = 3
POWER_CUT_BUDGET_S = float(os.environ.get("RUSEON_VM_POWER_CUT_BUDGET_S", "720"))
FRAGMENT_S = 1.0  # recording/recorder.py FRAGMENT_S
CUT_SLACK_S = 3.0
# The one camera ("cam", the default name) records into its own folder, as every camera does.
RECORD_DIR = "/var/lib/ruseon/recordings/cameras/cam"
# The host as qemu's user-mode network shows it to the guest: where the test's time server is.
NTP_ADDRESS = "10.0.2.2"
# The machine's real-time clock when it boots with "none" (``-rtc base=``): far behind anything
# else it knows, so its time comes from what systemd and timesyncd saved on the disk, as on a Pi.
NO_RTC = "2020-01-01T00:00:00"
# Under emulation on a loaded 2-core machine the boot took up to a few minutes.
BOOT_TIMEOUT_S = 900.0


@dataclass
class Booted:
    machine: qemu_vm.Machine
    work: Path
    report: dict[str, str]
    http_port: int
    ssh_port: int
    ssh_key: Path
    root_size_before: int
    accel: str
    timings: dict[str, float] = field(default_factory=dict)
    # The LAN's time server (tests/e2e/sntp.py), at 10.0.2.2 for the guest; None where the
    # guest's network is restricted (it could not reach it).
    ntp: SntpServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def provisioning_file(public_key: str, rtc_port: int) -> str:
    """The ruseon.toml a user drops on the boot partition (no token: the device makes one)."""
    return f"""\
[device]
hostname = "{HOSTNAME}"
ssh_authorized_keys = ["{public_key}"]
wifi_ssid = "{WIFI_SSID}"
wifi_psk = "{WIFI_PSK}"
wifi_country = "GB"

[camera]
source = "synthetic"
width = 320
height = 240
framerate = 15
keyframe_interval = 15

[webrtc]
listen = "0.0.0.0:{rtc_port}"
advertise = ["127.0.0.1"]

[recording]
continuous = true
segment_s = {SEGMENT_S}

[time]
ntp = ["{NTP_ADDRESS}"]
"""


def require_vm_bench() -> Path:
    """The cached disk image and the tools to boot it; fail in CI, skip elsewhere. A failed
    background preparation fails everywhere, with its log."""
    failed = background_prepare.failure(PREPARE)
    if failed:
        pytest.fail(failed, pytrace=False)
    problem = qemu_vm.missing(ARCH)
    if not problem and not shutil.which("ssh"):
        problem = "ssh (openssh-client)"
    try:
        if problem:
            raise nspawn.PrepareError(f"cannot boot the disk image: missing {problem} "
                                      "(scripts/install-system-deps)")
        return nspawn.disk_image(ARCH, build=False)
    except nspawn.PrepareError as exc:
        if IN_CI:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


def disk_image_file(image_dir: Path) -> Path:
    """The disk image in ``image_dir``: ``ruseon-disk.img.xz`` (what is published and flashed,
    the amd64 test's) or ``ruseon-disk.img`` (``image/build --disk --raw``: the emulated arm64
    machine's, never compressed); exactly one of them."""
    found = [image_dir / f"{nspawn.DISK_NAME}{suffix}" for suffix in (".img.xz", ".img")]
    found = [path for path in found if path.is_file()]
    if len(found) != 1:
        raise FileNotFoundError(
            f"{image_dir}: expected one of {nspawn.DISK_NAME}.img.xz or .img, found "
            f"{[p.name for p in found] or 'neither'}")
    return found[0]


def flash(image_dir: Path, disk: Path) -> None:
    """What a user does: check the download, write it with bmaptool (which verifies the data),
    from the ``.img.xz`` or, for a ``--raw`` build, the ``.img``."""
    image = disk_image_file(image_dir)
    subprocess.run(["sha256sum", "--quiet", "-c", f"{image.name}.sha256"], cwd=image_dir,
                   check=True)
    subprocess.run(["bmaptool", "-q", "copy", "--bmap",
                    str(image_dir / f"{nspawn.DISK_NAME}.img.bmap"), str(image), str(disk)],
                   check=True)


def http_get(url: str, timeout: float = 10, headers: dict[str, str] | None = None
             ) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def ssh_argv(booted: Booted, command: str) -> list[str]:
    """``ssh`` of ``command`` as the image's login user over the forwarded SSH port, with the
    key, on one connection per boot (ControlMaster): a new SSH connection to the emulated
    machine took 1.5-4.5 s under the suite's load, and a power cut's checks make dozens."""
    return ["ssh", "-i", str(booted.ssh_key), "-p", str(booted.ssh_port), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=30", "-o", "ControlMaster=auto",
            "-o", f"ControlPath={booted.work / 'ssh-mux'}", "-o", "ControlPersist=300",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            f"{IMAGE_USER}@127.0.0.1", command]


def ssh(booted: Booted, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``command`` as the image's login user over the forwarded SSH port, with the key."""
    return subprocess.run(ssh_argv(booted, command), capture_output=True, text=True,
                          timeout=timeout, check=False)


def ssh_close(booted: Booted) -> None:
    """End the shared connection (the machine it went to is gone: a cut, a power-off)."""
    subprocess.run([*ssh_argv(booted, "true")[:-2], "-O", "exit", f"{IMAGE_USER}@127.0.0.1"],
                   capture_output=True, timeout=30, check=False)


def monotonic_s(report: str, prop: str) -> float:
    match = re.search(rf"^{prop}=(\d+)$", report, re.M)
    return int(match.group(1)) / 1e6 if match else float("nan")


def boot_timings(report: dict[str, str], healthz_s: float) -> dict[str, float]:
    """kernel / userspace from systemd-analyze; the service's start to READY from its unit."""
    times: dict[str, float] = {"qemu_start_to_healthz_s": round(healthz_s, 1)}
    for what in ("firmware", "loader", "kernel", "userspace"):
        match = re.search(r"([\d.]+(?:min)?\s*[\d.]*m?s) \(" + what + r"\)", report["analyze"])
        if match:
            times[f"{what}_s"] = round(parse_span(match.group(1)), 1)
    service = report["ruseon"]
    start = monotonic_s(service, "ExecMainStartTimestampMonotonic")
    ready = monotonic_s(service, "ActiveEnterTimestampMonotonic")
    times["ruseon_started_after_boot_s"] = round(start, 1)
    times["ruseon_start_to_ready_s"] = round(ready - start, 1)
    times["ruseon_timeout_start_s"] = parse_span(
        re.search(r"^TimeoutStartUSec=(.*)$", service, re.M).group(1)  # type: ignore[union-attr]
    )
    return times


def parse_span(text: str) -> float:
    """systemd's time span ("1min 38.562s", "15.684s", "980ms") in seconds."""
    total = 0.0
    for value, unit in re.findall(r"([\d.]+)\s*(min|ms|s|h)", text):
        total += float(value) * {"h": 3600, "min": 60, "s": 1, "ms": 0.001}[unit]
    return total


def wait_booted(machine: qemu_vm.Machine, http_port: int) -> tuple[dict[str, str], float]:
    """The machine's report once it has booted, and how long /healthz took to answer."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    healthz_s = float("nan")
    while time.monotonic() < deadline and machine.running():
        if machine.restart_after_emulator_panic():
            warnings.warn("the emulated amd64 boot panicked on a stale int3 (QEMU's "
                          "multi-threaded TCG, qemu_vm.TCG_STALE_INT3); booted again",
                          stacklevel=1)
            deadline = time.monotonic() + BOOT_TIMEOUT_S
        with contextlib.suppress(OSError):
            if http_get(f"http://127.0.0.1:{http_port}/healthz", timeout=5)[0] == 200:
                healthz_s = time.monotonic() - machine.started
                break
        time.sleep(1)
    return machine.wait_report(max(60.0, deadline - time.monotonic())), healthz_s


@pytest.fixture(scope="module")
def booted() -> Iterator[Booted]:
    image_dir = require_vm_bench()
    run_root = nspawn.CACHE / "run"
    run_root.mkdir(parents=True, exist_ok=True)
    nspawn.sweep_stale_runs(run_root)
    work = Path(tempfile.mkdtemp(prefix="vm-", dir=run_root))
    machine: qemu_vm.Machine | None = None
    ntp: SntpServer | None = None
    try:
        disk = work / "disk.img"
        flash(image_dir, disk)
        key = work / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vm-test",
                        "-f", str(key)], check=True)
        rtc_port = free_port(socket.SOCK_DGRAM)
        qemu_vm.put_boot_file(disk, "ruseon.toml",
                              provisioning_file(key.with_suffix(".pub").read_text().strip(),
                                                rtc_port), work)
        root_size_before = qemu_vm.partitions(disk)[1].size
        # A card larger than the image: the free space growfs is for.
        os.truncate(disk, disk.stat().st_size + GROW_BY)
        http_port, ssh_port = free_port(), free_port()
        isolated = qemu_vm.isolated_netns()
        if isolated:  # the LAN's NTP server, answering from the start
            ntp = SntpServer().__enter__()
        machine = qemu_vm.Machine(disk, work, arch=ARCH, tcp={8080: http_port, 22: ssh_port},
                                  udp={rtc_port: rtc_port}, restrict=not isolated)
        accel = machine.start()
        print(f"\n[boot-vm] {ARCH}: {accel}; user-mode network "
              + ("unrestricted inside this loopback-only network namespace" if isolated
                 else "restrict=on (not in an isolated namespace: no UDP from the guest)"),
              flush=True)
        report, healthz_s = wait_booted(machine, http_port)
        timings = boot_timings(report, healthz_s)
        print(f"[boot-vm] {ARCH} boot times: {json.dumps(timings)}", flush=True)
        print(f"[boot-vm] systemd-analyze: {report['analyze'].splitlines()[0]}", flush=True)
        artifacts = nspawn.REPO / "artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / f"boot-vm-{ARCH}.json").write_text(
            json.dumps({"accel": accel, **timings, "blame": report.get("blame", ""),
                        "critical_chain": report.get("chain", "")}, indent=2) + "\n")
        result = Booted(machine, work, report, http_port, ssh_port, key, root_size_before,
                        accel, timings, ntp)
        yield result
        machine = result.machine  # the power-cut test boots the disk again (new machines)
    finally:
        if machine is not None:
            machine.kill()
            with contextlib.suppress(OSError):
                shutil.copyfile(machine.console_path, nspawn.REPO / "artifacts"
                                / f"boot-vm-{ARCH}-console.log")
        if ntp is not None:
            ntp.__exit__(None, None, None)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(autouse=True)
def loopback_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The viewer gathers exactly one host candidate, 127.0.0.1 (where the port is forwarded)."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


def test_the_flashed_image_is_the_compressed_one_a_user_downloads(booted: Booted) -> None:
    """amd64 keeps the product's output (``.img.xz`` + ``.sha256`` + ``.bmap``): that is what
    this test flashed; only the emulated arm64 machine's disk is a ``--raw`` build."""
    assert not nspawn.raw_disk(ARCH)
    image = disk_image_file(nspawn.disk_image(ARCH, build=False))
    assert image.name == f"{nspawn.DISK_NAME}.img.xz", image
    with image.open("rb") as fh:
        assert fh.read(6) == b"\xfd7zXZ\x00", image  # xz's magic
    assert not image.with_suffix("").exists(), "an uncompressed .img beside the .img.xz"


def test_systemd_reaches_multi_user_with_no_failed_unit(booted: Booted) -> None:
    report = booted.report
    assert report["state"] == "running", report
    assert report["failed"] == "", report["failed"]
    assert "ActiveState=active" in report["ruseon"] and "NRestarts=0" in report["ruseon"]


def test_first_boot_applied_hostname_wifi_and_ssh_key(booted: Booted) -> None:
    report = booted.report
    assert "Result=success" in report["firstboot"], report["firstboot"]
    assert report["hostname"] == HOSTNAME
    wifi = report["wifi"].splitlines()
    assert wifi[0] == "600 root", wifi
    for line in ("type=wifi", f"ssid={WIFI_SSID}", "key-mgmt=wpa-psk"):
        assert line in wifi, wifi
    public = booted.ssh_key.with_suffix(".pub").read_text().strip()
    assert public in report["keys"].splitlines()
    # The key turned SSH on (the built image has it off), with host keys made on this device,
    # not the ones the build's package install generated (every card would share those).
    assert report["ssh"] == "active"
    assert report["hostkey"].startswith("ssh-ed25519 "), report["hostkey"]
    built = nspawn.base_rootfs_path(ARCH, machine=True) / "etc/ssh/ssh_host_ed25519_key.pub"
    if built.exists():
        assert report["hostkey"].split()[1] != built.read_text().split()[1]


def test_the_key_logs_in_and_sudo_prints_the_admin_secret_that_opens_admin_routes(
    booted: Booted,
) -> None:
    """What the console's hint says a user does on first boot: ``sudo ruseon admin-secret``."""
    who = ssh(booted, "id -un && hostname")
    assert who.returncode == 0, who.stderr
    assert who.stdout.split() == [IMAGE_USER, HOSTNAME]
    secret = ssh(booted, "sudo -n ruseon admin-secret")
    assert secret.returncode == 0, secret.stderr
    value = secret.stdout.strip()
    assert re.fullmatch(r"[A-Za-z0-9_-]{16,}", value), value
    assert http_get(booted.url + "/metrics")[0] == 401
    status, body, _ = http_get(booted.url + "/metrics",
                               headers={"Authorization": f"Bearer {value}"})
    assert status == 200 and b"ruseon" in body


def test_growfs_grew_the_root_partition_and_filesystem(booted: Booted) -> None:
    report = booted.report
    assert report["growfs"].startswith("grew /dev/vda partition 2"), report["growfs"]
    sizes = {m["NAME"]: int(m["SIZE"]) for m in (
        dict(re.findall(r'(\w+)="([^"]*)"', line)) for line in report["lsblk"].splitlines())}
    # The partition now ends near the end of the larger disk (GPT's backup table behind it).
    assert sizes["vda2"] >= booted.root_size_before + GROW_BY - (4 << 20), sizes
    assert int(report["rootsize"]) > booted.root_size_before + GROW_BY // 2, report["rootsize"]


def test_service_page_snapshot_and_hls_answer_through_the_forwarded_port(booted: Booted) -> None:
    status, body, _ = http_get(booted.url + "/healthz")
    assert status == 200, body
    status, page, headers = http_get(booted.url + "/")
    assert status == 200 and headers.get("Content-Type", "").startswith("text/html")
    assert b"<html" in page.lower()
    status, jpeg, _ = http_get(booted.url + "/snapshot.jpg", timeout=30)
    assert status == 200 and jpeg[:2] == b"\xff\xd8", jpeg[:40]
    playlist = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, playlist, _ = http_get(booted.url + "/hls/index.m3u8", timeout=30)
        if status == 200 and b"#EXT-X-PART:" in playlist:
            break
        time.sleep(1)
    assert status == 200 and playlist.startswith(b"#EXTM3U"), playlist[:300]
    text = playlist.decode()
    init = re.search(r'#EXT-X-MAP:URI="([^"]+)"', text)
    part = re.search(r'#EXT-X-PART:[^\n]*URI="([^"]+)"', text)
    assert init and part, text
    status, init_bytes, _ = http_get(f"{booted.url}/hls/{init.group(1)}")
    assert status == 200 and b"ftyp" in init_bytes[:16], init_bytes[:32]
    status, part_bytes, _ = http_get(f"{booted.url}/hls/{part.group(1)}")
    assert status == 200 and b"moof" in part_bytes[:64], part_bytes[:32]


async def test_whep_viewer_decodes_frames_through_the_forwarded_udp_port(booted: Booted) -> None:
    if booted.machine.restrict:
        message = ("WHEP needs UDP from the guest, which restrict=on drops: run in a loopback-only "
                   "network namespace (scripts/test)")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    width, height, _ = await watch(booted.url, frames=5, timeout=90)
    assert (width, height) == (320, 240)


def test_boot_partition_read_only_and_network_manager_the_stack(booted: Booted) -> None:
    report = booted.report
    fstype, options = report["bootmount"].split()
    assert fstype == "vfat" and options.split(",")[0] == "ro", report["bootmount"]
    assert "ruseon.toml" not in report["bootfiles"].split()
    assert "ruseon-firstboot.log" in report["bootfiles"].split()
    assert re.search(r"^[^:]+:ethernet:connected$", report["network"], re.M), report["network"]
    # The resolver is what DHCP gave this machine (restricted: none), not the build host's.
    host = {line for line in Path("/etc/resolv.conf").read_text().splitlines()
            if line.startswith("nameserver")} if Path("/etc/resolv.conf").exists() else set()
    guest = {line for line in report["resolv"].splitlines() if line.startswith("nameserver")}
    expected = set() if booted.machine.restrict else {"nameserver 10.0.2.3"}
    assert guest == expected, report["resolv"]
    assert not host & guest - {"nameserver 10.0.2.3"}, (host, guest)
    if not booted.machine.restrict:  # restricted, DHCP names no server: NetworkManager writes none
        assert "No such file" not in report["resolv"], report["resolv"]


# -- power cuts while recording ------------------------------------------------------------------


def guest(booted: Booted, command: str, timeout: float = 120) -> str:
    result = ssh(booted, command, timeout)
    assert result.returncode == 0, (command, result.stderr)
    return result.stdout


def guest_bytes(booted: Booted, path: str) -> bytes:
    """A root-only file of the guest (``sudo cat`` over SSH)."""
    result = subprocess.run(ssh_argv(booted, f"sudo -n cat {path}"), capture_output=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def guest_clock_offset(booted: Booted) -> tuple[float, float]:
    """(guest wall clock - host wall clock, its uncertainty) in seconds: ``date`` over SSH ran
    somewhere between sending and the answer; the tightest of three."""
    best = (0.0, float("inf"))
    for _ in range(3):
        sent = time.time()
        guest_now = float(guest(booted, "date +%s.%N"))
        answered = time.time()
        if (answered - sent) / 2 < best[1]:
            best = (guest_now - (sent + answered) / 2, (answered - sent) / 2)
    return best


def recordings(booted: Booted) -> tuple[list[str], dict[str, str], list[str]]:
    """The guest's archive: file names, sha256 of the closed segments, what was set aside."""
    # No closed segment yet (a quick boot: the first one is still open) is an empty list, not a
    # broken answer (`sha256sum -- *.mp4` with nothing to match failed, and the rest was lost).
    out = guest(booted, f"sudo -n sh -c 'cd {RECORD_DIR} && ls -1; echo ==; "
                        "for f in *.mp4; do [ -e \"$f\" ] && sha256sum -- \"$f\"; done; "
                        "echo ==; ls -1 set-aside 2>/dev/null; true'")
    names, sums, aside = out.split("==\n")
    digests = {line.split()[1]: line.split()[0] for line in sums.splitlines()}
    return names.split(), digests, aside.split()


def assert_kept(closed: dict[str, str], sums: dict[str, str], when: str) -> None:
    """Every segment in ``closed`` (name -> sha256) is still there, byte for byte. By content,
    not name: when timesyncd synchronizes, the segments recorded before it (``~uncertain``) are
    renamed to their trusted times, and that is not a loss."""
    kept = set(sums.values())
    for name, digest in closed.items():
        assert digest in kept, f"{name} changed or went away {when}"


def segment_start(name: str) -> dt.datetime:
    stamp = name.removesuffix(".part").removesuffix(".mp4").removesuffix("~uncertain")
    return dt.datetime.strptime(stamp, "%Y-%m-%d_%H-%M-%S-%f").replace(tzinfo=dt.UTC)


def recording_state(booted: Booted) -> dict[str, object]:
    status, body, _ = http_get(booted.url + "/api/recording", timeout=30)
    assert status == 200, body[:300]
    state: dict[str, object] = json.loads(body)
    return state


def assert_listed_and_clipable(booted: Booted, names: list[str]) -> None:
    """Each closed segment is in /recordings/list and a clip from its start decodes."""
    status, body, _ = http_get(booted.url + "/recordings/list", timeout=30)
    assert status == 200, body[:300]
    ranges = [(dt.datetime.fromisoformat(r["start"]),
               dt.datetime.fromisoformat(r["start"]) + dt.timedelta(seconds=r["duration"]))
              for r in json.loads(body)]
    for name in names:
        start = segment_start(name)
        assert any(lo <= start < hi for lo, hi in ranges), (name, ranges)
        status, clip, _ = http_get(booted.url + "/recordings/get?" + urllib.parse.urlencode(
            {"start": start.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "duration": "3"}), timeout=60)
        assert status == 200, (name, clip[:300])
        path = booted.work / "clip.mp4"
        path.write_bytes(clip)
        assert ffmpeg_errors(path) == "", name
        # Pictures from its first keyframe on (how many: the emulated camera on a loaded machine
        # makes a few per second, not the 15 it is set to).
        frames = probe_frames(path)
        assert frames and frames[0][0], (name, frames)


def cut_and_boot(booted: Booted, extra: tuple[str, ...] = ()) -> tuple[dict[str, str], float]:
    """Cut the power (qemu SIGKILLed: no shutdown, nothing unflushed reaches the disk) and boot
    again, with qemu's ``extra`` arguments; the boot partition was not dirty, the machine booted
    with no failed unit and the service READY, the root file system needed its journal replay
    and nothing more. Returns the new boot's report and when /healthz answered."""
    booted.machine.kill()
    ssh_close(booted)
    assert_fat_clean(booted.machine.disk, booted.work)
    machine = qemu_vm.Machine(booted.machine.disk, booted.work, arch=ARCH,
                              tcp={8080: booted.http_port, 22: booted.ssh_port},
                              restrict=booted.machine.restrict, extra=extra)
    booted.machine = machine
    machine.start()
    report, healthz_s = wait_booted(machine, booted.http_port)
    assert report["state"] == "running" and report["failed"] == "", report
    assert "ActiveState=active" in report["ruseon"] and "NRestarts=0" in report["ruseon"]
    # The root file system: its journal was replayed (by the kernel's mount, or by an initramfs
    # fsck), then the boot's fsck found it clean; no ext4 error since.
    assert ("recovery complete" in report["ext4"]
            or "recovering journal" in report["fsck"]), (report["ext4"], report["fsck"])
    assert "EXT4-fs error" not in report["ext4"], report["ext4"]
    assert re.search(r"clean, \d+/\d+ files", report["fsck"]), report["fsck"]
    return report, healthz_s


def power_cut_plan() -> tuple[int, Path]:
    """How many cuts this run makes, and where the record of a full run of these inputs is."""
    key = hashlib.sha256(nspawn.disk_image_path(ARCH).name.encode()
                         + Path(__file__).read_bytes()).hexdigest()[:16]
    record = nspawn.CACHE / "power-cuts" / f"{ARCH}-{key}.json"
    forced = os.environ.get("RUSEON_VM_POWER_CUTS")
    if forced:
        return int(forced), record
    return (1 if record.is_file() else POWER_CUTS_FULL), record


def test_power_cuts_while_recording_lose_seconds_and_nothing_closed(booted: Booted) -> None:
    """The recording machine's power is cut (qemu SIGKILLed, its disk without a host cache) at
    a random moment of an open segment, ten times in a row (power_cut_plan), booting each time:
    the boot partition is not dirty, the root file system needed only its journal replay, no
    unit failed and the service is READY; every segment closed before the cut is there
    unchanged, listed and clip-able; the one open at the cut was repaired (or set aside) and
    counted, and what it kept ends at most sync_interval_s and a fragment before the cut."""
    # What a clean boot's report says of the root file system (what the cuts' boots must match).
    assert re.search(r"clean, \d+/\d+ files", booted.report["fsck"]), booted.report["fsck"]
    assert "EXT4-fs error" not in booted.report["ext4"], booted.report["ext4"]
    state = recording_state(booted)
    assert state["state"] == "recording" and state["segment_s"] == SEGMENT_S, state
    interval = float(state["sync_interval_s"])  # type: ignore[arg-type]
    assert interval > 0, state
    closed: dict[str, str] = {}  # every closed segment seen so far -> sha256
    checked: set[str] = set()
    figures = []
    cuts, record = power_cut_plan()
    if cuts < POWER_CUTS_FULL and record.is_file():
        print(f"\n[power-cut] {cuts} cut(s); the ten in a row of this disk image and test passed "
              f"before: {record}", flush=True)
    began = time.monotonic()
    for cut in range(1, cuts + 1):
        spent = time.monotonic() - began
        forced = "RUSEON_VM_POWER_CUTS" in os.environ
        # In CI only: elsewhere a full run must be able to leave its record.
        if IN_CI and cut > POWER_CUTS_MIN and spent > POWER_CUT_BUDGET_S and not forced:
            print(f"\n[power-cut] {cut - 1} of {cuts} cuts in {spent:.0f} s: the rest are past "
                  f"the budget of {POWER_CUT_BUDGET_S:.0f} s (POWER_CUT_BUDGET_S)", flush=True)
            break
        _, sums, _ = recordings(booted)
        assert_kept(closed, sums, f"before cut {cut}")
        closed.update(sums)
        assert_listed_and_clipable(booted, sorted(n for n, d in sums.items() if d not in checked))
        checked |= set(sums.values())
        # The open segment (between one segment's close and the next one's first write there
        # is a moment with none).
        for _ in range(30):
            parts = [n for n in recordings(booted)[0] if n.endswith(".mp4.part")]
            if len(parts) == 1:
                break
            time.sleep(1)
        assert len(parts) == 1, (parts, recording_state(booted))
        offset, uncertainty = guest_clock_offset(booted)
        # A random moment of an open segment, past the point where a lost sync would show: of
        # this one, or (when it is too old already) of the next.
        age = random.uniform(interval + FRAGMENT_S + CUT_SLACK_S + 2 * uncertainty + 1,
                             SEGMENT_S - 1.5)
        opened = segment_start(parts[0]).timestamp() - offset  # host clock
        cut_at = opened + age
        if cut_at < time.time() + 2:
            cut_at = opened + ((time.time() + 2 - opened) // SEGMENT_S + 1) * SEGMENT_S + 1 + age
        time.sleep(max(0.0, cut_at - 3 - time.time()))
        syncs = recording_state(booted)["syncs_total"]
        time.sleep(max(0.0, cut_at - time.time()))
        cut_host = time.time()
        cut_guest = dt.datetime.fromtimestamp(cut_host + offset, dt.UTC)
        _, healthz_s = cut_and_boot(booted)

        state = recording_state(booted)
        assert state["segments_repaired_total"] + state["segments_set_aside_total"] == 1, state  # type: ignore[operator]
        _, sums, aside = recordings(booted)
        assert_kept(closed, sums, f"after cut {cut}")
        # The segment open at the cut: the newest one that started before it.
        before = [n for n in [*sums, *aside] if segment_start(n) < cut_guest]
        victim = max(before, key=segment_start)
        if state["segments_repaired_total"]:
            assert victim in sums and sums[victim] not in closed.values(), (victim, sorted(sums))
            data = guest_bytes(booted, f"{RECORD_DIR}/{victim}")
            local = booted.work / "repaired.mp4"
            local.write_bytes(data)
            assert ffmpeg_errors(local) == "", victim
            frames = probe_frames(local)
            span = frames[-1][1] - frames[0][1]
            end = segment_start(victim) + dt.timedelta(seconds=span * len(frames)
                                                       / max(1, len(frames) - 1))
            lost = (cut_guest - end).total_seconds()
        else:
            lost = (cut_guest - segment_start(victim)).total_seconds()
        row = {"cut": cut, "open_segment_age_s": round((cut_guest - segment_start(victim))
                                                      .total_seconds(), 1),
               "lost_s": round(lost, 2), "clock_uncertainty_s": round(uncertainty, 2),
               "syncs_before_cut": syncs, "repaired": state["segments_repaired_total"],
               "set_aside": state["segments_set_aside_total"],
               "qemu_start_to_healthz_s": round(healthz_s, 1)}
        figures.append(row)
        print(f"\n[power-cut] {json.dumps(row)}", flush=True)
        assert state["segments_repaired_total"] == 1, (row, aside)
        assert -0.5 - uncertainty <= lost <= (interval + FRAGMENT_S + CUT_SLACK_S
                                              + uncertainty), row
    result = json.dumps({"sync_interval_s": interval, "segment_s": SEGMENT_S, "cuts": figures},
                        indent=2) + "\n"
    (nspawn.REPO / "artifacts" / f"power-cut-vm-{ARCH}.json").write_text(result)
    # What was closed before the last cut is still clip-able after it.
    _, sums, _ = recordings(booted)
    assert_listed_and_clipable(booted, sorted(n for n, d in sums.items() if d not in checked))
    if len(figures) >= POWER_CUTS_FULL:
        record.parent.mkdir(parents=True, exist_ok=True)
        for stale in record.parent.glob(f"{ARCH}-*.json"):
            stale.unlink()
        record.write_text(result)


# -- the clock: a machine without a real-time clock, NTP late -----------------------------------


def require_ntp(booted: Booted) -> SntpServer:
    if booted.ntp is None:
        message = ("the guest reaches the test's NTP server only unrestricted, in a loopback-only "
                   "network namespace (scripts/test)")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return booted.ntp


def timesyncd_state(booted: Booted) -> str:
    """What timesyncd says of itself (for a failure's message)."""
    return guest(booted, "systemctl is-active systemd-timesyncd; timedatectl timesync-status; "
                         "sudo -n journalctl -b -u systemd-timesyncd --no-pager | tail -n 20; true")


def guest_synchronized(booted: Booted, timeout: float) -> bool:
    """timesyncd says the clock is synchronized (NTPSynchronized) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if guest(booted, "timedatectl show -p NTPSynchronized --value").strip() == "yes":
            return True
        time.sleep(2)
    return False


def wait_recording(booted: Booted, what: str, predicate: Callable[[dict[str, Any]], bool],
                   timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    state: dict[str, Any] = recording_state(booted)
    while time.monotonic() < deadline:
        if predicate(state):
            return state
        time.sleep(1)
        state = recording_state(booted)
    raise AssertionError(f"{what}: not within {timeout:.0f} s: {state}")


def archive_ranges(booted: Booted) -> list[tuple[dt.datetime, dt.datetime, bool]]:
    """/recordings/list as (start, end, time uncertain), checked disjoint and in order."""
    status, body, _ = http_get(booted.url + "/recordings/list", timeout=30)
    assert status == 200, body[:300]
    ranges = [(dt.datetime.fromisoformat(r["start"]),
               dt.datetime.fromisoformat(r["start"]) + dt.timedelta(seconds=r["duration"]),
               bool(r.get("time_uncertain"))) for r in json.loads(body)]
    for (lo, hi, _), (next_lo, _, _) in itertools.pairwise(ranges):
        assert lo < hi <= next_lo, ("ranges overlap or are out of order", ranges)
    return ranges


def assert_ranges_clip_cleanly(booted: Booted) -> None:
    """Every range of the archive, clipped whole, decodes silently with non-decreasing times."""
    for i, (start, end, _) in enumerate(archive_ranges(booted)):
        query = urllib.parse.urlencode({"start": start.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                                        "duration": f"{(end - start).total_seconds():.3f}"})
        status, clip, _ = http_get(booted.url + "/recordings/get?" + query, timeout=120)
        assert status == 200, (start, clip[:300])
        path = booted.work / f"range-{i}.mp4"
        path.write_bytes(clip)
        assert ffmpeg_errors(path) == "", (start, end)
        times = [t for _, t in probe_frames(path)]
        assert times and all(b >= a for a, b in itertools.pairwise(times)), start
        path.unlink()


def clock_behind_then_ntp(booted: Booted, *, saved_clock_age_s: float | None) -> dict[str, Any]:
    """The clock scenario of a board without a real-time clock, on the real image: with NTP
    answering, the archive is recorded; then NTP stops answering and the power is cut; the
    machine boots with no usable RTC (qemu's set to NO_RTC), so systemd and timesyncd set its
    clock from what they saved on the disk, behind the archive; it records, uncertain, after the
    archive; then NTP answers again and timesyncd steps the clock. ``saved_clock_age_s``: make the
    saved time that old first (a card whose image was built, or that was last up, that long ago:
    ``/usr/lib/clock-epoch`` and timesyncd's clock file); None: as timesyncd left it (a power
    cut of a running board). Nothing is deleted or changed, the ranges stay disjoint and in
    order and decode, and what was recorded behind is re-timed to the real time."""
    ntp = require_ntp(booted)
    try:
        return _clock_behind_then_ntp(booted, ntp, saved_clock_age_s)
    finally:
        ntp.answering = True  # for what comes next, whatever happened here


def _clock_behind_then_ntp(booted: Booted, ntp: SntpServer,
                           saved_clock_age_s: float | None) -> dict[str, Any]:
    assert guest_synchronized(booted, 120), "timesyncd never synchronized with the LAN server"
    # Something closed, recorded with the clock right.
    state = wait_recording(booted, "a segment closed", lambda s: s["segments_closed_total"] >= 1)
    interval = float(state["sync_interval_s"])
    _, sums_before, _ = recordings(booted)
    # Where the archive ends at the cut: what is listed now, less what the cut may take of
    # the open segment (the power-cut test's bound).
    archive_end = max(end for _, end, _ in archive_ranges(booted)) - dt.timedelta(
        seconds=interval + FRAGMENT_S + CUT_SLACK_S)
    ntp.answering = False
    dropped = ntp.dropped
    if saved_clock_age_s is not None:
        then = int(time.time() - saved_clock_age_s)
        # Stopped first: timesyncd saves the time when it stops, and every 60 s.
        guest(booted, "sudo -n systemctl stop systemd-timesyncd && sudo -n touch -d "
                      f"@{then} /var/lib/systemd/timesync/clock /usr/lib/clock-epoch && sync")
    cut_and_boot(booted, ("-rtc", f"base={NO_RTC}"))
    offset, uncertainty = guest_clock_offset(booted)
    behind_s = -offset
    if saved_clock_age_s is None:
        # The time saved before the cut (at most a minute old) plus nothing for the time the
        # power was off and the boot took: behind, by seconds to minutes; not the RTC's 2020.
        assert 5 < behind_s < 600, behind_s
    else:
        # That old, or systemd's own build date if that is later (it never goes before it).
        assert behind_s > 86400, behind_s
    clock = wait_recording(booted, "the service's clock", lambda s: True)["clock"]
    assert clock["state"] == "uncertain" and clock["steps_total"] == 0, clock
    # Recorded behind: after the archive, marked uncertain, nothing deleted.
    state = wait_recording(booted, "segments closed behind the archive",
                           lambda s: s["segments_closed_total"] >= 2)
    assert state["segments_uncertain"] >= 1 and state["segments_deleted_total"] == 0, state
    newest = archive_ranges(booted)[-1]  # the last, after everything (archive_ranges checks)
    assert newest[2] and newest[0] >= archive_end, (newest, archive_end)
    # timesyncd keeps asking while nobody answers (ConnectionRetrySec=, 30 s), and when NTP
    # answers again it synchronizes by itself: nothing is restarted.
    deadline = time.monotonic() + 90
    while ntp.dropped == dropped and time.monotonic() < deadline:
        time.sleep(2)
    assert ntp.dropped > dropped, ("timesyncd did not ask while NTP was gone",
                                   timesyncd_state(booted))
    answered = ntp.answered
    ntp.answering = True
    assert guest_synchronized(booted, 150), ("no sync after NTP came back",
                                             ntp.answered - answered, timesyncd_state(booted))
    state = wait_recording(booted, "the step seen", lambda s: s["clock"]["steps_total"] >= 1)
    clock = state["clock"]
    assert clock["state"] == "synchronized", clock
    step = clock["last_step"]["by_s"]
    assert abs(step - behind_s) < 5 + uncertainty, (step, behind_s)
    closed = state["segments_closed_total"]
    state = wait_recording(booted, "a segment closed after the step",
                           lambda s: s["segments_closed_total"] > closed)
    # This run's segments are at their real times now: the ranges after the archive are trusted
    # and within minutes of now (the machine's clock is the host's again).
    now = dt.datetime.now(dt.UTC)
    deadline = time.monotonic() + 60
    while True:
        after = [r for r in archive_ranges(booted) if r[0] >= newest[0]]
        if after and not any(uncertain for _, _, uncertain in after):
            break
        assert time.monotonic() < deadline, ("still uncertain after the step", after)
        time.sleep(2)
    for start, end, _ in after:
        assert now - dt.timedelta(minutes=15) < start <= end < now + dt.timedelta(minutes=1), \
            (start, end, now)
    state = wait_recording(booted, "the archive's counters", lambda s: True)
    assert state["segments_deleted_total"] == 0 and state["segments_retimed_total"] >= 1, state
    _, sums, _ = recordings(booted)
    assert_kept(sums_before, sums, "after the clock went back and NTP stepped it")
    assert_ranges_clip_cleanly(booted)
    row = {"saved_clock_age_s": saved_clock_age_s, "behind_s": round(behind_s, 1),
           "step_s": round(step, 1), "retimed": state["segments_retimed_total"],
           "uncertain_left": state["segments_uncertain"], "ntp_answered": ntp.answered,
           "ntp_dropped": ntp.dropped}
    print(f"\n[clock] {json.dumps(row)}", flush=True)
    return row


def test_the_lan_ntp_server_from_first_boot_sets_the_clock(booted: Booted) -> None:
    """``[time] ntp`` of the first-boot file is timesyncd's server, and it synchronizes."""
    ntp = require_ntp(booted)
    conf = guest(booted, "cat /etc/systemd/timesyncd.conf.d/ruseon.conf")
    assert re.search(rf"^NTP={re.escape(NTP_ADDRESS)}$", conf, re.M), conf
    assert guest_synchronized(booted, 120), ("timesyncd never synchronized", ntp.answered)
    assert ntp.answered >= 1
    # qemu's RTC has whole seconds, and timesyncd slews an offset under 0.4 s.
    offset, uncertainty = guest_clock_offset(booted)
    assert abs(offset) < 2 + uncertainty, offset
    wait_recording(booted, "the service's clock synchronized",
                   lambda s: s["clock"]["state"] == "synchronized", timeout=30)


def test_a_power_cut_with_ntp_gone_boots_behind_the_archive_then_the_step_retimes(
    booted: Booted,
) -> None:
    """A running board loses power while NTP is unreachable: it boots at the time timesyncd
    last saved, behind its own archive (clock_behind_then_ntp)."""
    clock_behind_then_ntp(booted, saved_clock_age_s=None)


def test_a_card_400_days_behind_records_in_order_until_ntp_steps_it(booted: Booted) -> None:
    """The time the card saved is 400 days old (an image built, or a board shelved, that long
    ago): nothing of the archive is deleted as "400 days in the future" or as old once the
    clock is right (clock_behind_then_ntp)."""
    clock_behind_then_ntp(booted, saved_clock_age_s=400 * 86400)


def test_acpi_power_off_leaves_a_clean_boot_partition(booted: Booted) -> None:
    """Last: the power button shuts the machine down; the card then holds the first-boot log
    and no provisioning file (it had the Wi-Fi password)."""
    assert booted.machine.power_off(timeout=180), "the guest did not power off by itself"
    disk = booted.machine.disk
    files = qemu_vm.boot_files(disk)
    assert "ruseon.toml" not in files, sorted(files)
    log = files.get("ruseon-firstboot.log", "")
    assert "applied" in log and HOSTNAME in log, log
    assert WIFI_PSK not in log
    assert {"EFI", "loader", "vmlinuz", "initrd.img"} <= set(files), sorted(files)
    assert_fat_clean(disk, booted.work)


def assert_fat_clean(disk: Path, work: Path) -> None:
    """The FAT boot partition is clean: ``fsck.fat -n`` exits 0 and reports no dirty bit."""
    start = qemu_vm.partitions(disk)[0]
    fat = work / "boot.fat"
    with disk.open("rb") as src, fat.open("wb") as dst:
        src.seek(start.start)
        dst.write(src.read(start.size))
    fsck = subprocess.run(["fsck.fat", "-n", str(fat)], capture_output=True, text=True,
                          check=False)
    fat.unlink()
    assert fsck.returncode == 0 and "dirty" not in fsck.stdout.lower(), fsck.stdout


def test_disk_target_checks_its_base_and_options_before_building(tmp_path: Path) -> None:
    """A --base without a kernel (the container rootfs), a bad --xz-level and --raw without
    --disk (an uncompressed disk image of no disk) are refused, with the fix, before anything is
    built; --disk --raw with a machine rootfs passes the checks."""
    require_root("image/build requires root")
    (tmp_path / "rootfs/etc").mkdir(parents=True)

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(nspawn.REPO / "image/build"), "check", "debian", *args],
            capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)

    result = check("--disk", "--base", str(tmp_path / "rootfs"), "--xz-level", "12")
    assert result.returncode == 1
    assert "has no kernel (/boot/vmlinuz-*)" in result.stderr, result.stderr
    assert "image/debian/packages-machine" in result.stderr
    assert "--xz-level 12: 0 to 9" in result.stderr
    assert "--raw" not in result.stderr

    result = check("--raw", "--base", str(tmp_path / "rootfs"))
    assert result.returncode == 1
    assert "--raw keeps the disk image uncompressed: it needs --disk" in result.stderr, \
        result.stderr
    assert not list(tmp_path.rglob("*.img*"))

    # With a kernel the same base is a machine rootfs: --disk --raw has nothing to refuse.
    (tmp_path / "rootfs/boot").mkdir()
    (tmp_path / "rootfs/boot/vmlinuz-6.12.0-test").write_bytes(b"")
    result = check("--disk", "--raw", "--base", str(tmp_path / "rootfs"))
    assert result.returncode == 0, result.stderr
    assert "prerequisites for 'debian' are present" in result.stdout
