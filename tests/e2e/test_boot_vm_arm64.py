"""The arm64 disk image booted as a whole machine under emulation: what its boot showed.

``image/build debian --disk --arch arm64``, booted with qemu-system-aarch64 (``-M virt -cpu
cortex-a72``, TCG: no arm64 host here) and AAVMF UEFI firmware (Debian's qemu-efi-aarch64).
Emulated, the boot takes minutes, so tests/prepare.d/disk-arm64 builds the image and boots it in
the background while the other tests run, once per image key (everything in the image: the
machine rootfs, the lock's wheels, image/, systemd/, ruseon_appliance/, pyproject.toml), and
keeps the record (tests/e2e/vm_boot.py: ``.cache/disk-arm64-<key>/boot.json``). A changed input
is a new key, so a new build and boot; a clean clone (CI) always builds and boots. These tests
check that record: the image's own systemd reached multi-user with no failed unit,
ruseon.service became READY (with its start-to-READY under emulation against the unit's
``TimeoutStartSec``: a slow board must not miss its own start timeout), ``/healthz`` answered
through the forwarded port, ``/api/status`` showed the build (arm64, the lock) to the admin and
not to a stranger, and the ACPI power button shut it down. Boot and service times are printed.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests import background_prepare
from tests.e2e import nspawn, qemu_vm, vm_boot
from tests.test_lock import locked
from tests.tooling import IN_CI

PREPARE = "disk-arm64"
ARCH = "arm64"
pytestmark = [pytest.mark.slow, pytest.mark.background_prepare(PREPARE)]


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    failed = background_prepare.failure(PREPARE)
    if failed:
        pytest.fail(failed, pytrace=False)
    path = vm_boot.record_path(ARCH)
    if not path.exists():
        problem = qemu_vm.missing(ARCH) or nspawn.emulation_problem(ARCH)
        message = (f"no boot record {path}: tests/prepare.d/disk-arm64 builds and boots the "
                   f"arm64 disk image (as root){f'; missing {problem}' if problem else ''}")
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    data: dict[str, Any] = json.loads(path.read_text())
    timings = data["timings"]
    print(f"\n[boot-vm] {ARCH} ({data['accel']}; booted {data['booted_at']} from {data['image']}):"
          f" {json.dumps(timings)}")
    print(f"[boot-vm] {ARCH} systemd-analyze: {data['report']['analyze'].splitlines()[0]}")
    print(f"[boot-vm] {ARCH} ruseon.service start to READY {timings['ruseon_start_to_ready_s']} s"
          f" of TimeoutStartSec {timings['ruseon_timeout_start_s']} s")
    return data


def test_the_booted_disk_is_the_uncompressed_raw_build(record: dict[str, Any]) -> None:
    """The emulated machine boots ``image/build --disk --raw``'s ``.img`` (flashed with its bmap
    and checked against its sha256 by vm_boot), the build the cache holds for arm64."""
    assert nspawn.raw_disk(ARCH)
    assert record["image_file"] == f"{nspawn.DISK_NAME}.img", record["image_file"]
    assert record["image"] == nspawn.disk_image_path(ARCH).name


def test_systemd_reaches_multi_user_with_no_failed_unit(record: dict[str, Any]) -> None:
    report = record["report"]
    assert report["state"] == "running", report
    assert report["failed"] == "", report["failed"]
    # First boot ran from the boot partition (mounted read-only), and applied the file.
    fstype, options = report["bootmount"].split()
    assert fstype == "vfat" and options.split(",")[0] == "ro", report["bootmount"]
    assert "Result=success" in report["firstboot"], report["firstboot"]
    assert report["hostname"] == vm_boot.HOSTNAME
    assert report["growfs"].startswith("grew /dev/vda partition 2"), report["growfs"]


def test_the_service_is_ready_well_within_its_start_timeout(record: dict[str, Any]) -> None:
    """READY (active, never restarted) and the emulated start-to-READY below the unit's own
    TimeoutStartSec (systemd enforces it; the record says by how much it was met)."""
    service = record["report"]["ruseon"]
    assert "ActiveState=active" in service and "NRestarts=0" in service, service
    timings = record["timings"]
    ready, limit = timings["ruseon_start_to_ready_s"], timings["ruseon_timeout_start_s"]
    assert 0 < ready < limit, timings


def test_healthz_answers_through_the_forwarded_port(record: dict[str, Any]) -> None:
    assert record["healthz"]["status"] == 200, record["healthz"]
    assert record["healthz"]["body"].strip() == "ok"
    assert "cortex-a72" in record["command"] and "qemu-system-aarch64" in record["command"][0]


def test_status_shows_the_arm64_build_to_the_admin_only(record: dict[str, Any]) -> None:
    stranger = record["stranger_status"]
    assert stranger["status"] == 200  # viewing is open on the LAN by default
    body = json.loads(stranger["body"])
    assert body["access"]["role"] == "none" and "build" not in body
    admin = record["admin_status"]
    assert admin["status"] == 200 and admin["role"] == "admin"
    build = admin["build"]
    assert build["arch"] == ARCH
    assert re.fullmatch(r"[0-9a-f]{40}", build["commit"]), build
    assert build["commit"] not in stranger["body"]
    lock = Path(nspawn.LOCK_FILE).read_bytes()
    assert build["lock_sha256"] == hashlib.sha256(lock).hexdigest()
    assert build["packages"]["aiortc"] == locked()["aiortc"][0]


def test_acpi_power_button_shuts_it_down(record: dict[str, Any]) -> None:
    assert record["powered_off_by_itself"], record["console_tail"]
