"""qemu_vm's answer to the emulator's own panic (no qemu started: the console is written by
the test): a boot that died of QEMU's stale-int3 race under multi-threaded TCG is started
again once; any other panic, a second one, KVM or arm64 is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import qemu_vm

# The console of the boot that panicked in a clean-clone run (abridged).
STALE_INT3 = """\
[    4.350004] sched_clock: Marking stable (4396174762, -46734951)->(5770490705, -1421050894)
[    4.354285] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
[    4.355018] RIP: 0010:sched_clock_cpu+0x9/0x1d0
[    4.356841] Kernel panic - not syncing: Fatal exception in interrupt
[    7.089332] ---[ end Kernel panic - not syncing: Fatal exception in interrupt ]---
"""
OTHER_PANIC = """\
[    5.100000] VFS: Cannot open root device "vda2" or unknown-block(0,0): error -6
[    5.100100] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)
"""


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> qemu_vm.Machine:
    vars_file = tmp_path / "vars.fd"
    vars_file.write_bytes(b"\0" * 16)
    monkeypatch.setitem(qemu_vm.FIRMWARE, "amd64", (tmp_path / "code.fd", vars_file))
    made = qemu_vm.Machine(tmp_path / "disk.img", tmp_path)
    made.accel = "tcg"
    spawned: list[str] = []
    monkeypatch.setattr(made, "_spawn", lambda accel: spawned.append(accel))
    monkeypatch.setattr(made, "kill", lambda: None)
    made.spawned = spawned  # type: ignore[attr-defined]
    return made


def test_a_stale_int3_panic_is_booted_again_once(machine: qemu_vm.Machine) -> None:
    machine.console_path.write_text(STALE_INT3)
    assert machine.emulator_panicked()
    assert machine.restart_after_emulator_panic()
    assert machine.spawned == ["tcg"]  # type: ignore[attr-defined]
    assert (machine.work / "console-panic-1.log").read_text() == STALE_INT3
    # The same panic again in the new boot: not put down to chance a second time.
    assert not machine.restart_after_emulator_panic()
    assert machine.spawned == ["tcg"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("console,accel,arch", [
    (OTHER_PANIC, "tcg", "amd64"),  # the image's own failure
    (STALE_INT3, "kvm", "amd64"),  # no TCG, no such race
    (STALE_INT3, "tcg", "arm64"),
    ("[    4.3] Oops: int3: 0000 [#1]\n", "tcg", "amd64"),  # an Oops the kernel lived through
])
def test_other_failures_are_not_booted_again(machine: qemu_vm.Machine, console: str,
                                             accel: str, arch: str) -> None:
    machine.console_path.write_text(console)
    machine.accel, machine.arch = accel, arch
    assert not machine.restart_after_emulator_panic()
    assert machine.spawned == []  # type: ignore[attr-defined]
