"""The disk image booted as a whole machine under qemu-system, reached only through forwarded ports.

:class:`Machine` boots a copy of ``image/build debian --disk``'s image with UEFI firmware (OVMF
on amd64, AAVMF on arm64) and qemu's user-mode networking: the guest gets an address by DHCP from
qemu; the host reaches it only through the ports forwarded to 127.0.0.1 (``hostfwd``).

Isolation: with ``restrict=on`` the guest reaches nothing, but libslirp then drops *every* UDP
datagram the guest sends (``udp_input``: ``if (slirp->restricted) goto bad;``, after DHCP and
TFTP), the replies to a forwarded UDP port included, so WebRTC cannot work. When the test runs
in a network namespace that has only loopback (scripts/test's), :func:`isolated_netns` says so
and the machine runs unrestricted: whatever the guest opens goes out through this namespace,
which reaches nothing either. Elsewhere it stays ``restrict=on`` and the UDP checks cannot run.

The image itself is not changed for the test: what the test
wants to read from inside (failed units, boot times, partition sizes) comes from a unit passed as
a systemd *system credential* over SMBIOS (``systemd.extra-unit.*``, ``systemd.unit-dropin.*``,
read by the image's systemd-debug-generator; systemd >= 256), which writes a report to a
virtio serial port that qemu writes to a file.

Acceleration: KVM when ``/dev/kvm`` really runs the guest (the kernel's first line reaches the
console), else emulation (TCG). The machines these tests were written on have a ``/dev/kvm`` that
cannot boot Debian's kernel (a software virtualizer without VMX/SVM), so the probe matters.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPORT_PORT = "org.ruseon.report"
REPORT_END = "== end"
FIRMWARE = {
    "amd64": (Path("/usr/share/OVMF/OVMF_CODE_4M.fd"), Path("/usr/share/OVMF/OVMF_VARS_4M.fd")),
    "arm64": (Path("/usr/share/AAVMF/AAVMF_CODE.fd"), Path("/usr/share/AAVMF/AAVMF_VARS.fd")),
}
QEMU = {"amd64": "qemu-system-x86_64", "arm64": "qemu-system-aarch64"}
# Debian packages that provide them (scripts/install-system-deps installs them in CI).
QEMU_PACKAGES = {"amd64": "qemu-system-x86 ovmf", "arm64": "qemu-system-arm qemu-efi-aarch64"}
HOST_MACHINE = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "")

# What the report unit prints, section by section ("== NAME" lines), once the boot has finished.
REPORT_SCRIPT = r"""#!/bin/sh
exec > /dev/virtio-ports/org.ruseon.report 2>&1
section() { echo "== $1"; }
# Type=exec: this unit's own start is not part of the boot the wait is for.
systemctl is-system-running --wait >/dev/null 2>&1
section state; systemctl is-system-running
section failed; systemctl --failed --plain --no-legend --no-pager
section analyze; systemd-analyze time --no-pager
section blame; systemd-analyze blame --no-pager | head -n 12
section chain; systemd-analyze critical-chain --no-pager ruseon.service
section ruseon
systemctl show ruseon.service -p ActiveState -p SubState -p NRestarts -p TimeoutStartUSec \
    -p ExecMainStartTimestampMonotonic -p ActiveEnterTimestampMonotonic \
    -p InactiveExitTimestampMonotonic
section firstboot; systemctl show ruseon-firstboot.service -p Result -p ActiveState
section hostname; hostname
section lsblk; lsblk -b -n -P -o NAME,SIZE,TYPE,MOUNTPOINT
section rootsize; df -B1 --output=size / | tail -n 1
section growfs; cat /var/lib/ruseon-growfs/done
section wifi
f=/etc/NetworkManager/system-connections/ruseon-wifi.nmconnection
stat -c '%a %U' "$f"; grep -E '^(type|ssid|key-mgmt)=' "$f"
section keys; cat /home/pi/.ssh/authorized_keys
section bootmount; findmnt -n -o FSTYPE,OPTIONS /boot/firmware
section bootfiles; ls /boot/firmware
section resolv; cat /etc/resolv.conf
section network; nmcli -t -f DEVICE,TYPE,STATE device
section ssh; systemctl is-active ssh.service
section hostkey; cat /etc/ssh/ssh_host_ed25519_key.pub
section fsck; journalctl -b -o cat --no-pager -u systemd-fsck-root.service
cat /run/initramfs/fsck.log 2>/dev/null
section ext4; journalctl -k -b -o cat --no-pager | grep 'EXT4-fs'
section end
"""
REPORT_UNIT = """[Unit]
Description=RUSEON VM test: report this machine's state to the host (test credential)
After=multi-user.target

[Service]
Type=exec
ImportCredential=ruseon.vm-report
ExecStart=/bin/sh ${CREDENTIALS_DIRECTORY}/ruseon.vm-report
"""
REPORT_WANTS = "[Unit]\nWants=ruseon-vm-report.service\n"


def missing(arch: str) -> str | None:
    """What is missing to boot ``arch`` here (None: nothing)."""
    problems = [f"{QEMU[arch]} ({QEMU_PACKAGES[arch]})"] if not shutil.which(QEMU[arch]) else []
    problems += [f"{path} ({QEMU_PACKAGES[arch]})" for path in FIRMWARE[arch] if not path.exists()]
    for tool, package in (("bmaptool", "bmap-tools"), ("sfdisk", "fdisk"), ("mcopy", "mtools")):
        if not shutil.which(tool):
            problems.append(f"{tool} ({package})")
    return ", ".join(problems) or None


def isolated_netns() -> bool:
    """True when this process's network namespace has no interface but loopback (nothing the
    guest could reach through an unrestricted user-mode network)."""
    # Not /sys/class/net: sysfs shows the namespace of whoever mounted it.
    try:
        return [name for _, name in socket.if_nameindex()] == ["lo"]
    except OSError:
        return False


def direct_io(path: Path) -> bool:
    """Whether ``path`` can be opened with O_DIRECT (qemu's cache=none needs it)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        return False
    return True


def kvm_available(arch: str) -> bool:
    """A /dev/kvm we may open, for the host's own architecture (it may still not work)."""
    return arch == HOST_MACHINE and os.access("/dev/kvm", os.R_OK | os.W_OK)


@dataclass
class Partition:
    start: int  # bytes
    size: int  # bytes


def partitions(disk: Path) -> list[Partition]:
    """The disk's partitions from its partition table (``sfdisk --json``)."""
    table = json.loads(subprocess.run(["sfdisk", "--json", str(disk)], capture_output=True,
                                      text=True, check=True).stdout)["partitiontable"]
    sector = int(table.get("sectorsize", 512))
    return [Partition(p["start"] * sector, p["size"] * sector) for p in table["partitions"]]


def fat_spec(disk: Path) -> str:
    """The mtools image spec of the first partition (the FAT boot partition)."""
    return f"{disk}@@{partitions(disk)[0].start}"


def mtools(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=True,
                          env={**os.environ, "MTOOLS_SKIP_CHECK": "1"})


def put_boot_file(disk: Path, name: str, content: str, work: Path) -> None:
    """Write ``name`` onto the FAT boot partition, as a user does with a card reader."""
    local = work / name
    local.write_text(content)
    mtools("mcopy", "-o", "-i", fat_spec(disk), str(local), f"::/{name}")
    local.unlink()


def boot_files(disk: Path) -> dict[str, str]:
    """Names and (for small text files) contents of the FAT partition's top directory."""
    spec = fat_spec(disk)
    names = mtools("mdir", "-b", "-i", spec, "::/").stdout.split()
    files: dict[str, str] = {}
    for path in names:
        name = path.removeprefix("::/").rstrip("/")
        text = ""
        if name.endswith((".log", ".toml", ".invalid", ".conf")):
            text = mtools("mtype", "-i", spec, f"::/{name}").stdout
        files[name] = text
    return files


def credential(name: str, value: str) -> list[str]:
    """qemu arguments passing a systemd system credential over SMBIOS (type 11 OEM string)."""
    encoded = base64.b64encode(value.encode()).decode()
    return ["-smbios", f"type=11,value=io.systemd.credential.binary:{name}={encoded}"]


def report_credentials() -> list[str]:
    return [*credential("ruseon.vm-report", REPORT_SCRIPT),
            *credential("systemd.extra-unit.ruseon-vm-report.service", REPORT_UNIT),
            *credential("systemd.unit-dropin.multi-user.target", REPORT_WANTS)]


def parse_report(text: str) -> dict[str, str]:
    """The report's sections by name (``== NAME`` lines)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip() for name, lines in sections.items()}


# QEMU 7.2's multi-threaded TCG on x86 (-cpu max) now and then lets one vCPU run a breakpoint
# that another vCPU's text_poke_bp has already patched away: the kernel takes it for a real one
# and panics a few seconds into the boot ("Oops: int3 ... RIP: sched_clock_cpu", at the switch
# to the TSC clocksource; one boot of a clean-clone run's eight or so). The emulator's fault,
# not the image's: such a boot is started again, once (Machine.restart_after_emulator_panic).
# With thread=single it never races, but every boot took twice as long (healthz 99 s vs 51 s).
TCG_STALE_INT3 = re.compile(r"Oops: int3\b[\s\S]*Kernel panic - not syncing")


class Machine:
    """One qemu-system VM over ``disk``; ``tcp``/``udp``: guest port -> host port on 127.0.0.1."""

    def __init__(self, disk: Path, work: Path, *, arch: str = "amd64",
                 tcp: Mapping[int, int] | None = None, udp: Mapping[int, int] | None = None,
                 memory_mib: int = 1024, cpus: int = 2, extra: Sequence[str] = (),
                 restrict: bool = True) -> None:
        if not restrict and not isolated_netns():
            raise RuntimeError("an unrestricted user-mode network only inside a network "
                               "namespace with nothing but loopback (isolated_netns())")
        self.restrict = restrict
        self.disk, self.work, self.arch = disk, work, arch
        self.tcp, self.udp = dict(tcp or {}), dict(udp or {})
        self.memory_mib, self.cpus, self.extra = memory_mib, cpus, list(extra)
        self.console_path = work / "console.log"
        self.report_path = work / "report.txt"
        self.qmp_path = work / "qmp.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.accel = ""
        self.started = 0.0
        # Boots started again after the emulator's own panic (TCG_STALE_INT3).
        self.emulator_restarts = 0
        code, variables = FIRMWARE[arch]
        self.vars = work / "efivars.fd"
        if not self.vars.exists():
            shutil.copyfile(variables, self.vars)
        self.code = code

    def command(self, accel: str) -> list[str]:
        forwards = [f"hostfwd=tcp:127.0.0.1:{h}-:{g}" for g, h in self.tcp.items()]
        forwards += [f"hostfwd=udp:127.0.0.1:{h}-:{g}" for g, h in self.udp.items()]
        restrict = ["restrict=on"] if self.restrict else []
        netdev = ",".join(["user", "id=net0", *restrict, *forwards])
        if self.arch == "amd64":
            machine = ["-M", "q35"]
            cpu = ["-cpu", "host"] if accel == "kvm" else ["-cpu", "max"]
        else:
            machine = ["-M", "virt"]
            cpu = ["-cpu", "host"] if accel == "kvm" else ["-cpu", "cortex-a72"]
        accel_arg = "kvm" if accel == "kvm" else "tcg,thread=multi"
        return [
            QEMU[self.arch], *machine, "-accel", accel_arg, *cpu,
            "-smp", str(self.cpus), "-m", str(self.memory_mib),
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={self.code}",
            "-drive", f"if=pflash,format=raw,unit=1,file={self.vars}",
            # No host cache: what the guest had not flushed is lost when qemu is killed (where
            # the file system can do O_DIRECT; tmpfs cannot).
            "-drive", f"file={self.disk},format=raw,if=none,id=disk0,"
                      f"cache={'none' if direct_io(self.disk) else 'writeback'},aio=threads",
            "-device", "virtio-blk-pci,drive=disk0",
            "-netdev", netdev, "-device", "virtio-net-pci,netdev=net0",
            "-serial", f"file:{self.console_path}",
            "-device", "virtio-serial-pci",
            "-chardev", f"file,id=report,path={self.report_path}",
            "-device", f"virtserialport,chardev=report,name={REPORT_PORT}",
            "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
            *report_credentials(), *self.extra,
        ]

    def _spawn(self, accel: str) -> None:
        for path in (self.console_path, self.report_path, self.qmp_path):
            path.unlink(missing_ok=True)
        self.log = (self.work / f"qemu-{accel}.log").open("wb")
        self.accel = accel
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.command(accel), stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def start(self, kvm_probe_s: float = 60.0) -> str:
        """Boot; KVM first where there is one, emulation when KVM does not run the kernel.
        Returns why this accelerator was chosen (for the test's output)."""
        if kvm_available(self.arch):
            self._spawn("kvm")
            deadline = time.monotonic() + kvm_probe_s
            while time.monotonic() < deadline and self.proc is not None \
                    and self.proc.poll() is None:
                if "Linux version" in self.console():
                    return "KVM (the kernel runs under /dev/kvm)"
                if "KVM internal error" in self.qemu_log():  # the guest is stopped for good
                    break
                time.sleep(0.5)
            exited = self.proc is not None and self.proc.poll() is not None
            log = self.qemu_log()
            tail = log[-300:].strip()
            self.kill()
            if exited:
                why = f"qemu with KVM exited ({tail or 'no message'})"
            elif "KVM internal error" in log:
                first = log.strip().splitlines()[0]
                failure = " (emulation failure)" if "emulation failure" in log else ""
                why = f"KVM stopped the guest: {first}{failure}"
            else:
                why = f"no kernel output under KVM in {kvm_probe_s:.0f} s"
            self._spawn("tcg")
            return f"emulation (TCG): {why}"
        self._spawn("tcg")
        return "emulation (TCG): no usable /dev/kvm"

    def qemu_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.work / f"qemu-{self.accel}.log").read_text(errors="replace")
        return ""

    def console(self) -> str:
        with contextlib.suppress(OSError):
            return self.console_path.read_text(errors="replace")
        return ""

    def report(self) -> str:
        with contextlib.suppress(OSError):
            return self.report_path.read_text(errors="replace")
        return ""

    def emulator_panicked(self) -> bool:
        """Whether this boot died of the emulator's stale-breakpoint panic (TCG_STALE_INT3)."""
        return (self.accel == "tcg" and self.arch == "amd64"
                and TCG_STALE_INT3.search(self.console()) is not None)

    def restart_after_emulator_panic(self) -> bool:
        """Once per machine: when this boot died of :data:`TCG_STALE_INT3`, kill qemu (its
        console kept as ``console-panic-N.log``) and start it again on the same disk, with the
        same accelerator. False when it did not panic so, or was started again already (a
        second such panic is not put down to chance)."""
        if self.emulator_restarts >= 1 or not self.emulator_panicked():
            return False
        self.kill()
        self.emulator_restarts += 1
        shutil.copyfile(self.console_path,
                        self.work / f"console-panic-{self.emulator_restarts}.log")
        self._spawn(self.accel)
        return True

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_report(self, timeout: float) -> dict[str, str]:
        """The report of the booted machine (after the boot finished), by section."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.report()
            if REPORT_END in text:
                return parse_report(text)
            if not self.running():
                raise AssertionError(f"qemu exited during boot:\n{self.qemu_log()[-2000:]}\n"
                                     f"console:\n{self.console()[-6000:]}")
            time.sleep(1)
        raise AssertionError(f"no report from the machine in {timeout:.0f} s; console:\n"
                             f"{self.console()[-6000:]}\nreport so far:\n{self.report()}")

    def qmp(self, command: str) -> None:
        """One QMP command (e.g. ``system_powerdown``: the ACPI power button)."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(self.qmp_path))
            reader = sock.makefile("rb")
            reader.readline()  # greeting
            for message in ({"execute": "qmp_capabilities"}, {"execute": command}):
                sock.sendall(json.dumps(message).encode() + b"\n")
                while True:
                    reply = json.loads(reader.readline())
                    if "return" in reply or "error" in reply:
                        break

    def power_off(self, timeout: float = 120) -> bool:
        """Press the ACPI power button and wait for qemu to exit; True when the guest shut
        down by itself (False: it had to be killed)."""
        if not self.running():
            return True
        with contextlib.suppress(OSError, ValueError):
            self.qmp("system_powerdown")
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def kill(self) -> None:
        """SIGKILL: a power cut (the disk has no host cache)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        with contextlib.suppress(AttributeError):
            self.log.close()
