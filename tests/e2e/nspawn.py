"""Debian rootfs under ``.cache/``, the appliance installed into it, booted with systemd-nspawn.

Shared by the systemd e2e test and the image test. Three layers, each cached or cheap:

1. :func:`base_rootfs` — ``mmdebstrap`` of the packages in ``image/debian/packages``, built once
   into ``.cache/rootfs-<hash>`` (the hash covers the package list, suite, mirror and arch). It is
   never modified afterwards.
2. :func:`wheels_dir` — the dependencies' wheels exactly as ``requirements.lock`` pins them
   (plus setuptools and wheel for building the project offline) in ``.cache/wheels-<hash>``,
   downloaded with the host venv's pip, hashes checked.
3. :class:`Overlay` — a writable overlayfs over the base for one test run; the project is
   installed into it with the same ``systemd/install.sh`` a board uses, offline from the wheels.

Layers 1 and 2 need the package mirrors, so ``python -m tests.e2e.nspawn prepare`` builds them
outside the test's private network namespace (``tests/prepare.d/`` runs it from ``make test``).

:class:`Container` boots a rootfs with
``systemd-nspawn -D ROOTFS -b --register=no --keep-unit --console=pipe`` in the caller's network
namespace (so it shares loopback with the test) and controls it with ``nsenter -t PID -a``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"
PACKAGES_FILE = REPO / "image" / "debian" / "packages"
# What `image/build debian --disk` adds for a machine (kernel, NetworkManager, growpart, ...).
MACHINE_PACKAGES_FILE = REPO / "image" / "debian" / "packages-machine"
INSTALL_SCRIPT = REPO / "systemd" / "install.sh"
# The wheels every image installs, pinned with hashes (image/build lock writes it).
LOCK_FILE = REPO / "requirements.lock"
# The product's suite and its Python (image/build fetches the wheels for the same pair).
SUITE = "trixie"
PYTHON = "3.13"
MIRROR = "http://deb.debian.org/debian"
# Bump to rebuild every cached rootfs when the recipe below changes.
RECIPE = "2"
# apt runs debconf's dpkg-preconfigure (perl, apt-extracttemplates on every .deb) before dpkg, to
# ask questions up front; with the noninteractive frontend there are none, and under qemu it was
# a large share of the arm64 rootfs's build. Off while mmdebstrap installs, removed afterwards:
# the result is the same rootfs. image/build does the same.
NO_PRECONFIGURE = "etc/apt/apt.conf.d/71ruseon-build-no-preconfigure"
MMDEBSTRAP_HOOKS = [
    f"--essential-hook=echo '#clear DPkg::Pre-Install-Pkgs;' > \"$1/{NO_PRECONFIGURE}\"",
    f"--customize-hook=rm -f \"$1/{NO_PRECONFIGURE}\"",
]
ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}
HOST_ARCH = next((a for a, m in ARCHES.items() if m == os.uname().machine), os.uname().machine)


class PrepareError(RuntimeError):
    """A cached layer is missing and cannot be built here (e.g. no mirror in a netns)."""


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold ``.cache/NAME.lock`` exclusively: the arm64 preparation runs in the background while
    the amd64 one and pytest run, and they share the host's wheels and the project's build."""
    locks = CACHE / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with (locks / f"{name}.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def remove_tree(path: Path) -> None:
    """``rm -rf`` a cached tree left by a killed build, unmounting what it left mounted first
    (image/build bind-mounts /dev into its rootfs: deleting through that would empty the host's)."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        points = [line.split()[1].replace("\\040", " ") for line in fh]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        left = [line.split()[1] for line in fh if line.split()[1].startswith(prefix)]
    if left:
        raise PrepareError(f"cannot remove {path}: still mounted: {' '.join(left)}")
    shutil.rmtree(path, ignore_errors=True)


def _package_list(path: Path, arch: str) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    names = (line.split("#", 1)[0].strip() for line in lines)
    return [name.replace("@ARCH@", arch) for name in names if name]


def debian_packages(arch: str = "amd64", *, machine: bool = False) -> list[str]:
    """The package list shared with ``image/build debian`` (``--disk``: ``machine``)."""
    packages = _package_list(PACKAGES_FILE, arch)
    if machine:
        packages += _package_list(MACHINE_PACKAGES_FILE, arch)
    return packages


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def machine_on_base(arch: str) -> bool:
    """Whether the machine rootfs of ``arch`` is the base rootfs plus the machine packages
    (:func:`_build_machine_on_base`) rather than a second mmdebstrap of both lists: for an
    emulated ``arch``, where every package's unpacking and maintainer scripts run under qemu-user
    and the base's share of them would all run a second time. The host's own architecture (the
    amd64 boot test, flashed as the product is) keeps mmdebstrap's single run of both lists, the
    way ``image/build debian --disk`` without ``--base`` builds it."""
    return arch != HOST_ARCH


# Bump to rebuild the machine rootfs built on a base (below) when that recipe changes.
MACHINE_ON_BASE_RECIPE = "2"


def base_rootfs_path(arch: str = "amd64", *, machine: bool = False) -> Path:
    """Where the cached base rootfs for ``arch`` lives (it may not exist yet); ``machine``: the
    one ``image/build debian --disk`` starts from (with a kernel, NetworkManager, ...), keyed on
    the base's key and the machine package list when it is built on the base."""
    if machine and machine_on_base(arch):
        key = _digest(MACHINE_ON_BASE_RECIPE, base_rootfs_path(arch).name,
                      *_package_list(MACHINE_PACKAGES_FILE, arch))
        return CACHE / f"rootfs-machine-{arch}-{key}"
    packages = debian_packages(arch, machine=machine)
    key = _digest(RECIPE, SUITE, MIRROR, arch, *packages)
    return CACHE / (f"rootfs-machine-{arch}-{key}" if machine else f"rootfs-{arch}-{key}")


def base_rootfs(arch: str = "amd64", *, build: bool = True, machine: bool = False) -> Path:
    """The cached base rootfs, built with mmdebstrap when missing and ``build`` is true (the
    machine rootfs of an emulated arch: from the base rootfs, :func:`machine_on_base`)."""
    path = base_rootfs_path(arch, machine=machine)
    if (path / ".complete").exists():
        return path
    if not build:
        raise PrepareError(
            f"no cached rootfs at {path}: run `.venv/bin/python -m tests.e2e.nspawn prepare` "
            "outside the test network namespace (make test does it)"
        )
    # The base first (outside this lock: it takes its own; the arm64 image's preparation may be
    # building it right now).
    base = base_rootfs(arch) if machine and machine_on_base(arch) else None
    with cache_lock(path.name):
        if not (path / ".complete").exists():
            if machine:
                for stale in CACHE.glob(f"rootfs-machine-{arch}-*"):
                    remove_tree(stale)
            if base is not None:
                _build_machine_on_base(arch, base, path,
                                       _package_list(MACHINE_PACKAGES_FILE, arch))
            else:
                _build_base_rootfs(arch, path, debian_packages(arch, machine=machine))
    return path


def _build_base_rootfs(arch: str, path: Path, packages: list[str]) -> None:
    partial = path.with_name(path.name + ".partial")
    remove_tree(partial)
    _log(f"building {path.name} with mmdebstrap ({len(packages)} packages)")
    subprocess.run(
        [
            "mmdebstrap", "--variant=apt", "--mode=root", f"--arch={arch}",
            "--include=" + ",".join(packages), *MMDEBSTRAP_HOOKS,
            SUITE, str(partial), MIRROR,
        ],
        check=True,
    )
    if not (partial / f"usr/bin/python{PYTHON}").exists():
        raise PrepareError(f"{SUITE} {arch} has no python{PYTHON}: update PYTHON here and "
                           "image_python in image/build together")
    (partial / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    partial.rename(path)


# Installs the machine packages into a copy of the base, in a mount namespace of its own (its
# mounts end with it, also when it is killed). As mmdebstrap installs its --include packages:
# apt on the host working on the tree, dpkg in the chroot; no Recommends (mmdebstrap installs
# none), no daemon started (policy-rc.d), no debconf preconfiguration (as MMDEBSTRAP_HOOKS).
# Afterwards apt's lists and .debs, its logs, /run and /tmp are removed, as mmdebstrap's cleanup
# does, and nothing of this step is left in the tree. Checked against mmdebstrap's single run of
# both lists, amd64 and arm64: the same packages at the same versions, the same file list, the
# same initramfs content; only the numbers of the system users and groups the packages add
# differ (the order they were added in). image/build debian --disk reads nothing else of
# mmdebstrap's own run: the kernel and initramfs in /boot, systemd-boot's EFI binary, the files.
_MACHINE_ON_BASE_SCRIPT = r"""
set -eu
root=$1; shift
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 0755 "$root/usr/sbin/policy-rc.d"
echo '#clear DPkg::Pre-Install-Pkgs;' > "$root/$NO_PRECONFIGURE"
# apt itself runs natively, on the tree (its configuration, lists, cache and dpkg status there),
# as mmdebstrap runs it: under qemu-user, reading the package lists took minutes. dpkg and the
# maintainer scripts run in the chroot (DPkg::Chroot-Directory).
conf=$root/tmp/ruseon-build-apt.conf
cat > "$conf" <<EOF
Apt::Architecture "$ARCH";
Apt::Architectures "$ARCH";
Dir "$root";
Dir::State::Status "$root/var/lib/dpkg/status";
Dir::Etc::Trusted "$root/etc/apt/trusted.gpg";
Dir::Etc::TrustedParts "$root/etc/apt/trusted.gpg.d";
EOF
apt_in_root() {
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 APT_CONFIG="$conf" \
        TMPDIR="$root/tmp" DEBIAN_FRONTEND=noninteractive DEBCONF_NONINTERACTIVE_SEEN=true \
        apt-get -q -o Dpkg::Use-Pty=0 -o APT::Install-Recommends=false \
        -o Dir::Bin::dpkg=env -o DPkg::Options::=--unset=TMPDIR -o DPkg::Options::=dpkg \
        -o "DPkg::Chroot-Directory=$root" "$@"
}
# One initramfs, made once everything is installed: in a single apt run the kernel's postinst
# hook makes one and initramfs-tools' trigger makes it again (under qemu-user each is minutes of
# emulated compression); the way live-build does it, update-initramfs diverted meanwhile.
chroot "$root" dpkg-divert --quiet --local --rename --add "$UPDATE_INITRAMFS"
printf '#!/bin/sh\nexit 0\n' > "$root$UPDATE_INITRAMFS"
chmod 0755 "$root$UPDATE_INITRAMFS"
apt_in_root update
apt_in_root install -y -o DPkg::Options::=--force-unsafe-io "$@"
apt_in_root clean
rm -f "$root$UPDATE_INITRAMFS"
chroot "$root" dpkg-divert --quiet --local --rename --remove "$UPDATE_INITRAMFS"
for kernel in "$root"/boot/vmlinuz-*; do
    [ -e "$kernel" ] || continue
    chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 \
        update-initramfs -c -k "${kernel##*/vmlinuz-}"
done
lists=$root/var/lib/apt/lists
find "$lists" -mindepth 1 -maxdepth 1 ! -name lock ! -name partial -exec rm -rf {} +
rm -f "$root/usr/sbin/policy-rc.d" "$root/$NO_PRECONFIGURE" "$root/var/cache/apt/"*.bin
# mmdebstrap's cleanup/reproducible, cleanup/run and cleanup/tmp, as for the base.
cd "$root"
rm -f var/log/dpkg.log var/log/apt/history.log var/log/apt/term.log var/log/alternatives.log \
    var/cache/ldconfig/aux-cache var/log/apt/eipp.log.xz var/lib/dbus/machine-id
if [ -e etc/machine-id ]; then : > etc/machine-id; fi
find run -mindepth 1 -maxdepth 1 ! -name lock -exec rm -rf {} +
find tmp -mindepth 1 -maxdepth 1 -exec rm -rf {} +
"""


def _build_machine_on_base(arch: str, base: Path, path: Path, packages: list[str]) -> None:
    """The machine rootfs: a copy of the finished ``base`` with the machine ``packages``
    installed by apt (see :func:`machine_on_base`)."""
    partial = path.with_name(path.name + ".partial")
    remove_tree(partial)
    _log(f"building {path.name}: {base.name} and apt-get install of {len(packages)} packages")
    began = time.monotonic()
    subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(partial)], check=True)
    (partial / ".complete").unlink()
    subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--",
         "sh", "-c", _MACHINE_ON_BASE_SCRIPT, "sh", str(partial), *packages],
        check=True, env={**os.environ, "NO_PRECONFIGURE": NO_PRECONFIGURE,
                         "UPDATE_INITRAMFS": "/usr/sbin/update-initramfs", "ARCH": arch},
    )
    for what in ("vmlinuz", "initrd.img"):
        if not list((partial / "boot").glob(f"{what}-*")):
            raise PrepareError(f"{partial}: apt-get installed no /boot/{what}-*")
    (partial / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    partial.rename(path)
    _log(f"{path.name} built in {time.monotonic() - began:.0f} s")


# Built into the wheel cache so the project itself can be built offline (build isolation).
BUILD_REQUIREMENTS = ["setuptools>=68", "wheel"]


def wheels_dir_name(arch: str) -> str:
    """The cache directory name of :func:`wheels_dir` (keyed on the lock)."""
    key = _digest(RECIPE, PYTHON, arch, LOCK_FILE.read_text(encoding="utf-8"),
                  *BUILD_REQUIREMENTS)
    return f"wheels-{arch}-{key}"


def wheels_dir(arch: str = HOST_ARCH, *, build: bool = True) -> Path:
    """The locked wheels of the project's dependencies for the rootfs's Python on ``arch``
    (cached), downloaded on the host by ``image/build wheels``; plus the host's build
    requirements."""
    path = CACHE / wheels_dir_name(arch)
    if (path / ".complete").exists():
        return path
    if not build:
        raise PrepareError(
            f"no cached wheels at {path}: run `.venv/bin/python -m tests.e2e.nspawn prepare`"
        )
    with cache_lock(path.name):
        if not (path / ".complete").exists():
            _download_wheels(arch, path)
    return path


def _download_wheels(arch: str, path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    _log(f"downloading {path.name}: the wheels {LOCK_FILE.name} pins")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    # setuptools and wheel (pure Python) build the project on the host, offline.
    subprocess.run([*pip, "download", "-q", "-d", str(path), *BUILD_REQUIREMENTS], check=True)
    subprocess.run([str(REPO / "image/build"), "wheels", "--arch", arch, "--out", str(path)],
                   check=True)
    (path / ".complete").touch()


def project_version() -> str:
    """pyproject.toml's version (the wheel's and build-info's)."""
    with (REPO / "pyproject.toml").open("rb") as fh:
        version: str = tomllib.load(fh)["project"]["version"]
    return version


def project_wheel(out_dir: Path, *, wheels: Path | None = None) -> Path:
    """Build the project's wheel from this checkout, offline (build deps from the cache).

    ``$E2E_PROJECT_SOURCE`` names another source tree (e.g. a ``git archive`` of a commit).
    """
    wheels = wheels or wheels_dir(build=False)
    source = Path(os.environ.get("E2E_PROJECT_SOURCE") or REPO)
    out_dir.mkdir(parents=True, exist_ok=True)
    # pip builds in the source tree (build/, *.egg-info): one build at a time.
    with cache_lock("project-wheel"):
        subprocess.run(
            [
                sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "-q",
                "--no-index", "--find-links", str(wheels), "--no-deps", "-w", str(out_dir),
                str(source),
            ],
            check=True,
            env={**os.environ, "PIP_NO_INPUT": "1"},
        )
    found = sorted(out_dir.glob("ruseon_appliance-*.whl"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise PrepareError(f"pip wheel wrote no ruseon_appliance wheel into {out_dir}")
    return found[-1]


def prepare(arch: str = HOST_ARCH) -> None:
    """Build every cached layer that needs the network (idempotent). For a foreign ``arch``
    also the appliance image itself (slow under emulation, so cached on its inputs)."""
    base_rootfs(arch)
    wheels_dir(arch)
    if arch != HOST_ARCH:
        appliance_image(arch)


BINFMT = Path("/proc/sys/fs/binfmt_misc")


def emulation_problem(arch: str) -> str | None:
    """Why ``arch`` binaries cannot run here (None when they can: native, or qemu binfmt with
    the F flag, which systemd-nspawn needs because the interpreter is outside the rootfs)."""
    machine = ARCHES[arch]
    if os.uname().machine == machine:
        return None
    entry = BINFMT / f"qemu-{machine}"
    try:
        text = entry.read_text()
    except OSError:
        return (f"qemu-{machine} is not registered in {BINFMT} "
                f"(tests/prepare.d/binfmt-qemu enables it as root)")
    if not text.startswith("enabled"):
        return f"{entry} is disabled (update-binfmts --enable qemu-{machine})"
    flags = next((line.split(":", 1)[1] for line in text.splitlines()
                  if line.startswith("flags:")), "")
    if "F" not in flags:
        return f"{entry} lacks the F (fix-binary) flag containers need: flags {flags.strip()!r}"
    return None


def _tree_digest(*roots: Path) -> str:
    """Digest of every tracked-looking file's path and content under ``roots``."""
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*")):
            # Documentation does not change what is built.
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".md":
                h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def appliance_image_path(arch: str) -> Path:
    """Where ``image/build debian --arch ARCH`` is cached: keyed on its inputs (the base rootfs,
    the wheels, image/ and systemd/), not on the project's code, which a test reinstalls."""
    key = _digest(RECIPE, base_rootfs_path(arch).name, wheels_dir_name(arch),
                  _tree_digest(REPO / "image", REPO / "systemd"))
    return CACHE / f"image-{arch}-{key}"


def appliance_image(arch: str, *, build: bool = True) -> Path:
    """The appliance image for ``arch`` built by ``image/build debian`` (cached)."""
    path = appliance_image_path(arch)
    if (path / ".complete").exists():
        return path
    if not build:
        raise PrepareError(
            f"no cached {arch} image at {path}: run `.venv/bin/python -m tests.e2e.nspawn "
            f"prepare {arch}` outside the test network namespace (make test does it)"
        )
    problem = emulation_problem(arch)
    if problem:
        raise PrepareError(f"cannot build the {arch} image: {problem}")
    with cache_lock(path.name):
        if not (path / ".complete").exists():
            _build_appliance_image(arch, path)
    return path


def _build_appliance_image(arch: str, path: Path) -> None:
    for stale in CACHE.glob(f"image-{arch}-*"):
        remove_tree(stale)
    wheels = wheels_dir(arch, build=False)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        # The host's wheels (the build requirements): the amd64 preparation may be building
        # them right now, in parallel with this one; wheels_dir waits for it (cache_lock).
        wheel = project_wheel(Path(tmp), wheels=wheels_dir(HOST_ARCH))
        _log(f"building {path.name}: image/build debian --arch {arch} (under emulation)")
        # The host's rootfs has the same Python: it byte-compiles the venv natively, not pip
        # under qemu (ensurepip alone compiled pip's ~800 files for minutes).
        subprocess.run(
            [str(REPO / "image/build"), "debian", "--arch", arch,
             "--base", str(base_rootfs(arch, build=False)), "--wheel", str(wheel),
             "--wheels", str(wheels), "--out", str(CACHE), "--name", path.name,
             "--compile-with", str(base_rootfs(HOST_ARCH))],
            check=True,
        )
    seconds = time.monotonic() - began
    (path / ".complete").write_text(f"{seconds:.0f}\n")
    _log(f"{path.name} built in {seconds:.0f} s")


# -- the bootable disk image (image/build debian --disk), for tests/e2e/test_boot_vm.py ----------
DISK_NAME = "ruseon-disk"


def raw_disk(arch: str) -> bool:
    """Whether the cached disk of ``arch`` is ``image/build --disk --raw`` (``ruseon-disk.img``,
    not compressed): the emulated arm64 machine's, which only tests/e2e/vm_boot.py boots. The
    amd64 one stays the ``.img.xz`` a user downloads and flashes, and test_boot_vm.py flashes it
    that way (the product's path)."""
    return arch == "arm64"


def disk_image_path(arch: str) -> Path:
    """Where ``image/build debian --disk`` for ``arch`` is cached: keyed on everything in it
    (the machine rootfs, the wheels, image/, systemd/ and the project's code: a disk image
    cannot have the project reinstalled the way the container tests do)."""
    key = _digest(RECIPE, base_rootfs_path(arch, machine=True).name, wheels_dir_name(arch),
                  _tree_digest(REPO / "image", REPO / "systemd", REPO / "ruseon_appliance"),
                  (REPO / "pyproject.toml").read_text(encoding="utf-8"),
                  "raw" if raw_disk(arch) else "xz")
    return CACHE / f"disk-{arch}-{key}"


def disk_image(arch: str = HOST_ARCH, *, build: bool = True) -> Path:
    """The directory with ``ruseon-disk.img.xz`` and ``.img.xz.sha256`` (or, :func:`raw_disk`,
    ``ruseon-disk.img`` and ``.img.sha256``) and ``.img.bmap`` (cached)."""
    path = disk_image_path(arch)
    if (path / ".complete").exists():
        return path
    if not build:
        raise PrepareError(
            f"no cached {arch} disk image at {path}: run `.venv/bin/python -m tests.e2e.nspawn "
            f"prepare-disk {arch}` outside the test network namespace (make test does it)"
        )
    problem = emulation_problem(arch)
    if problem:
        raise PrepareError(f"cannot build the {arch} disk image: {problem}")
    base = base_rootfs(arch, machine=True)
    wheels = wheels_dir(arch)
    with cache_lock(path.name):
        if not (path / ".complete").exists():
            _build_disk_image(arch, path, base, wheels)
    return path


def _build_disk_image(arch: str, path: Path, base: Path, wheels: Path) -> None:
    for stale in CACHE.glob(f"disk-{arch}-*"):
        remove_tree(stale)
    partial = path.with_name(path.name + ".partial")
    remove_tree(partial)
    partial.mkdir(parents=True)
    began = time.monotonic()
    wheel = project_wheel(partial / "dist", wheels=wheels_dir(HOST_ARCH))
    command = [str(REPO / "image/build"), "debian", "--disk", "--arch", arch, "--base", str(base),
               "--wheel", str(wheel), "--wheels", str(wheels), "--out", str(partial),
               "--name", DISK_NAME]
    command += ["--raw"] if raw_disk(arch) else ["--xz-level", "0"]
    if arch != HOST_ARCH:
        command += ["--compile-with", str(base_rootfs(HOST_ARCH))]
    _log(f"building {path.name}: {' '.join(command[1:4])}")
    subprocess.run(command, check=True)
    # Only the disk image is kept; its rootfs directory is gigabytes the tests do not read.
    remove_tree(partial / DISK_NAME)
    remove_tree(partial / "dist")
    seconds = time.monotonic() - began
    (partial / ".complete").write_text(f"{seconds:.0f}\n")
    partial.rename(path)
    _log(f"{path.name} built in {seconds:.0f} s")


def missing_tools() -> list[str]:
    """Tools the container tests need that are not installed."""
    return [t for t in ("mmdebstrap", "systemd-nspawn", "nsenter", "unshare")
            if shutil.which(t) is None]


class Overlay:
    """A writable overlayfs over a read-only base rootfs, under ``.cache/run/``.

    ``path`` is the merged tree to boot; everything written lands in the upper layer, which
    :meth:`remove` deletes.
    """

    def __init__(self, base: Path, name: str = "run") -> None:
        self.base = base
        run_root = CACHE / "run"
        run_root.mkdir(parents=True, exist_ok=True)
        sweep_stale_runs(run_root)
        self.root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=run_root))
        self.upper = self.root / "upper"
        self.work = self.root / "work"
        self.path = self.root / "merged"
        for d in (self.upper, self.work, self.path):
            d.mkdir()
        subprocess.run(
            [
                "mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={base},upperdir={self.upper},workdir={self.work}", str(self.path),
            ],
            check=True,
        )

    def remove(self) -> None:
        """Unmount and delete the writable layer."""
        subprocess.run(["umount", "-l", str(self.path)], check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Overlay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


# A run directory untouched for this long belongs to a test that was killed, not a live one.
STALE_RUN_SECONDS = 3 * 3600


def sweep_stale_runs(run_root: Path) -> None:
    """Unmount and delete run directories left behind by killed test runs."""
    now = time.time()
    for entry in run_root.iterdir():
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime < STALE_RUN_SECONDS:
                continue
            subprocess.run(["umount", "-l", str(entry / "merged")], check=False,
                           capture_output=True)
            shutil.rmtree(entry, ignore_errors=True)


def run_in_rootfs(
    rootfs: Path,
    command: Sequence[str],
    *,
    binds_ro: Sequence[tuple[Path, str]] = (),
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run one command inside ``rootfs`` (not booted) with ``systemd-nspawn --pipe``."""
    args = ["systemd-nspawn", "-q", "--pipe", "--register=no", "--keep-unit", "-D", str(rootfs),
            f"--machine=ruseon-{os.getpid()}-{time.monotonic_ns() % 10**6}"]
    args += [f"--bind-ro={src}:{dst}" for src, dst in binds_ro]
    result = subprocess.run(
        [*args, "--", *command], capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed in {rootfs} ({result.returncode}):\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result


def install_appliance(rootfs: Path, wheel: Path, *extra_args: str) -> str:
    """Run ``systemd/install.sh`` inside ``rootfs`` with ``wheel``, offline, the dependencies as
    the lock pins them (as the image installs them); return its output."""
    wheels = wheels_dir(build=False)
    result = run_in_rootfs(
        rootfs,
        [
            "/mnt/src/systemd/install.sh", "--source", f"/mnt/dist/{wheel.name}",
            "--wheels", "/mnt/wheels", "--lock", f"/mnt/src/{LOCK_FILE.name}", *extra_args,
        ],
        binds_ro=[(REPO, "/mnt/src"), (wheel.parent, "/mnt/dist"), (wheels, "/mnt/wheels")],
    )
    return result.stdout + result.stderr


class Container:
    """A booted rootfs: ``systemd-nspawn -b`` in the caller's network namespace."""

    def __init__(self, rootfs: Path, *, log_path: Path | None = None,
                 netns: Path | None = None, binds: Sequence[tuple[Path, str]] = ()) -> None:
        self.rootfs = rootfs
        self.log_path = log_path or (rootfs.parent / "console.log")
        self._log = self.log_path.open("wb")
        # Default: the caller's network namespace; ``netns``: one the caller made (a veth).
        network = [f"--network-namespace-path={netns}"] if netns else []
        network += [f"--bind={src}:{dst}" for src, dst in binds]
        self.proc = subprocess.Popen(
            [
                "systemd-nspawn", "-q", "-D", str(rootfs), "-b", "--register=no", "--keep-unit",
                "--console=pipe", f"--machine=ruseon-{os.getpid()}-{time.monotonic_ns() % 10**6}",
                *network,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started = time.monotonic()
        self.leader = self._find_leader()

    def _find_leader(self, timeout: float = 30) -> int:
        """PID (in our namespace) of the container's init: nspawn's child."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited early:\n{self.console()}")
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            with contextlib.suppress(OSError):
                for pid in children.read_text().split():
                    with contextlib.suppress(OSError):
                        if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                            return int(pid)
            time.sleep(0.05)
        raise RuntimeError(f"no init process under systemd-nspawn:\n{self.console()}")

    def console(self) -> str:
        """What the container printed so far (systemd's boot messages)."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-8000:]

    def run(
        self, *command: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the booted container (all its namespaces)."""
        result = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", *command],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} -> {result.returncode}\n{result.stdout}\n{result.stderr}"
            )
        return result

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``systemctl ARGS`` in the container."""
        return self.run("systemctl", *args, check=check)

    def wait_booted(self, timeout: float = 120) -> str:
        """Wait until the boot finished; returns ``running`` or ``degraded``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"container exited during boot:\n{self.console()}")
            state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                return state
            time.sleep(0.2)
        raise TimeoutError(f"boot did not finish in {timeout} s:\n{self.console()}")

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show UNIT -p ...`` as a dict."""
        out = self.systemctl("show", unit, *(f"-p{p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, *args: str) -> list[dict[str, object]]:
        """``journalctl -o json ARGS`` entries."""
        out = self.run("journalctl", "--no-pager", "-o", "json", *args).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def stop(self, timeout: float = 30) -> None:
        """Power the container off (SIGKILL if it does not go in time)."""
        if self.proc.poll() is None:
            # nspawn turns SIGTERM into an orderly poweroff of the container's init.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def require_bench() -> None:
    """Root, the tools and the cached layers for a container test; fail in CI, skip elsewhere."""
    import pytest

    from tests.tooling import IN_CI, require_root, require_tool

    require_root("mount overlayfs and boot systemd-nspawn")
    for tool in ("systemd-nspawn", "nsenter", "mmdebstrap"):
        require_tool(tool, "scripts/install-system-deps")
    try:
        base_rootfs(build=False)
        wheels_dir(build=False)
    except PrepareError as exc:
        if IN_CI:
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             interval: float = 0.1) -> None:
    """Poll ``predicate()`` until it is truthy; raise AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _log(message: str) -> None:
    print(f"[nspawn] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> int:
    """``python -m tests.e2e.nspawn prepare [ARCH]``: build the cached layers;
    ``prepare-disk [ARCH]``: the bootable disk image (``image/build debian --disk``).

    A foreign ARCH it cannot emulate is one clear line: exit 1 in CI, 0 elsewhere (its tests
    then skip, or fail in CI)."""
    if not argv or argv[0] not in ("prepare", "prepare-disk"):
        print("usage: python -m tests.e2e.nspawn prepare|prepare-disk [amd64|arm64]",
              file=sys.stderr)
        return 2
    missing = missing_tools()
    if missing:
        print(f"nspawn prepare: missing {' '.join(missing)}: run scripts/install-system-deps",
              file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("nspawn prepare: needs root (mmdebstrap --mode=root); skipped", file=sys.stderr)
        return 0
    arch = argv[1] if len(argv) > 1 else HOST_ARCH
    if arch not in ARCHES:
        print(f"nspawn prepare: unknown arch {arch!r} ({', '.join(ARCHES)})", file=sys.stderr)
        return 2
    problem = emulation_problem(arch)
    if problem:
        print(f"nspawn prepare: cannot run {arch} here: {problem}", file=sys.stderr)
        return 1 if os.environ.get("CI") == "true" else 0
    try:
        if argv[0] == "prepare-disk":
            disk_image(arch)
        else:
            prepare(arch)
    except PrepareError as exc:
        print(f"nspawn prepare: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
