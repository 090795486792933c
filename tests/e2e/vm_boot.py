"""Boot a cached disk image once and keep what the boot showed, for a slow (emulated) machine.

The arm64 disk image under qemu-system-aarch64 (TCG: a whole Cortex-A72 machine emulated on x86)
takes minutes to boot; tests/prepare.d/disk-arm64 runs this module in the background, while
pytest runs the other tests, right after building the image, and writes ``boot.json`` into the
image's cache directory (``.cache/disk-arm64-<key>``: keyed on everything in the image). The
boot runs when that key changed (the image's inputs did) and always on a clean clone (CI);
tests/e2e/test_boot_vm_arm64.py then checks the record. The checks are the machine's own
facts, collected from outside through forwarded ports and from a report unit passed in as a
systemd credential (tests/e2e/qemu_vm.py): state and failed units, ruseon.service's start and
READY against its TimeoutStartSec, ``/healthz``, ``/api/status`` as a stranger and as admin
(the image's build info), and an ACPI power-off.

``python -m tests.e2e.vm_boot arm64`` (as root, in a network namespace with only loopback, as
the prepare step runs it: the guest's user-mode network is then unrestricted but reaches nothing
but that namespace; elsewhere ``restrict=on``) boots it when no record for this key exists;
``--again`` boots even then.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.e2e import nspawn, qemu_vm
from tests.e2e.test_boot_vm import boot_timings, disk_image_file, flash, http_get
from tests.tooling import free_port

RECORD = "boot.json"
HOSTNAME = "cam-vm-arm64"
# The admin secret the provisioning file sets (auth.token): /api/status as admin shows the build.
ADMIN_SECRET = "vm-boot-admin-secret-0123456789"
GROW_BY = 1 << 30
# Emulated arm64 on a shared 2-core machine: first figures were several minutes to /healthz.
BOOT_TIMEOUT_S = 1800.0
# How long /healthz may still take to say 200 after the boot finished (systemd's view).
HEALTHZ_GRACE_S = 180.0


def record_path(arch: str) -> Path:
    """Where the boot record of the cached disk image for ``arch`` is (it may not exist)."""
    return nspawn.disk_image_path(arch) / RECORD


def provisioning_file(rtc_port: int) -> str:
    return f"""\
[device]
hostname = "{HOSTNAME}"

[auth]
token = "{ADMIN_SECRET}"

[camera]
source = "synthetic"
width = 320
height = 240
framerate = 15
keyframe_interval = 15

[webrtc]
listen = "0.0.0.0:{rtc_port}"
advertise = ["127.0.0.1"]
"""


def _log(message: str) -> None:
    print(f"[vm-boot] {message}", file=sys.stderr, flush=True)


def boot(arch: str, image_dir: Path) -> dict[str, Any]:
    """Flash, provision, boot ``image_dir``'s image; what it showed, as JSON data."""
    run_root = nspawn.CACHE / "run"
    run_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"vm-{arch}-", dir=run_root))
    machine: qemu_vm.Machine | None = None
    began = time.monotonic()
    try:
        disk = work / "disk.img"
        flash(image_dir, disk)
        rtc_port = free_port(socket.SOCK_DGRAM)
        qemu_vm.put_boot_file(disk, "ruseon.toml", provisioning_file(rtc_port), work)
        os.truncate(disk, disk.stat().st_size + GROW_BY)
        http_port = free_port()
        isolated = qemu_vm.isolated_netns()
        machine = qemu_vm.Machine(disk, work, arch=arch, tcp={8080: http_port},
                                  udp={rtc_port: rtc_port}, restrict=not isolated)
        accel = machine.start()
        _log(f"{arch}: {accel}; {machine.cpus} vCPUs, {machine.memory_mib} MiB; network "
             + ("unrestricted (loopback-only namespace)" if isolated else "restrict=on"))
        url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        healthz: dict[str, Any] = {"status": None}
        # Until /healthz is 200; once the boot has finished (the report is in) a little longer
        # at most, then the last answer is the record (a device without its camera says why).
        reported_at: float | None = None
        while time.monotonic() < deadline and machine.running():
            with contextlib.suppress(OSError):
                status, body, _ = http_get(url + "/healthz", timeout=5)
                healthz = {"status": status, "body": body.decode(errors="replace"),
                           "after_s": round(time.monotonic() - machine.started, 1)}
                if status == 200:
                    break
            if reported_at is None and qemu_vm.REPORT_END in machine.report():
                reported_at = time.monotonic()
            if reported_at is not None and time.monotonic() - reported_at > HEALTHZ_GRACE_S:
                break
            time.sleep(2)
        report = machine.wait_report(max(60.0, deadline - time.monotonic()))
        healthz_s = healthz["after_s"] if healthz["status"] == 200 else float("nan")
        timings = boot_timings(report, healthz_s)
        _log(f"{arch} boot times: {json.dumps(timings)}")
        stranger_status, stranger_body, _ = http_get(url + "/api/status", timeout=30)
        admin_status, admin_body, _ = http_get(
            url + "/api/status", timeout=30,
            headers={"Authorization": f"Bearer {ADMIN_SECRET}"})
        admin = json.loads(admin_body) if admin_status == 200 else {}
        powered_off = machine.power_off(timeout=300)
        return {
            "arch": arch, "image": image_dir.name, "image_file": disk_image_file(image_dir).name,
            "accel": accel, "cpus": machine.cpus,
            "memory_mib": machine.memory_mib, "restrict": machine.restrict,
            "command": machine.command(machine.accel),
            "booted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.monotonic() - began, 1),
            "timings": timings, "report": report, "healthz": healthz,
            "stranger_status": {"status": stranger_status,
                                "body": stranger_body.decode(errors="replace")},
            "admin_status": {"status": admin_status, "build": admin.get("build"),
                             "role": admin.get("access", {}).get("role")},
            "powered_off_by_itself": powered_off,
            "console_tail": machine.console()[-4000:],
        }
    finally:
        if machine is not None:
            machine.kill()
            with contextlib.suppress(OSError):
                artifacts = nspawn.REPO / "artifacts"
                artifacts.mkdir(exist_ok=True)
                shutil.copyfile(machine.console_path, artifacts / f"boot-vm-{arch}-console.log")
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str]) -> int:
    """``python -m tests.e2e.vm_boot ARCH [--again]``: boot the cached disk image of ARCH
    when it has no record yet; exit 1 when it could not boot (in CI also when the image or a
    tool is missing; elsewhere that is one line and exit 0, and the test then skips)."""
    if not argv or argv[0] not in nspawn.ARCHES:
        print("usage: python -m tests.e2e.vm_boot amd64|arm64 [--again]", file=sys.stderr)
        return 2
    arch = argv[0]
    # scripts/test stops a background step with SIGTERM: still kill qemu and remove the copy.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    in_ci = os.environ.get("CI") == "true"
    path = record_path(arch)
    if path.exists() and "--again" not in argv:
        _log(f"{path.parent.name} booted before ({path}): not again (its inputs did not change)")
        return 0
    problem = qemu_vm.missing(arch)
    if problem or not (path.parent / ".complete").exists():
        why = f"missing {problem}" if problem else f"no disk image at {path.parent}"
        _log(f"cannot boot {arch}: {why}")
        return 1 if in_ci else 0
    record = boot(arch, path.parent)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.rename(path)
    artifacts = nspawn.REPO / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copyfile(path, artifacts / f"boot-vm-{arch}.json")
    _log(f"record: {path} ({record['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
