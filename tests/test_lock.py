"""``requirements.lock``, the wheels every image installs (pip --require-hashes --no-deps), agrees
with pyproject.toml's ranges, with the dev venv these tests run in (scripts/bootstrap-venv
installs the lock's versions), with the versions the aiortc/aioice/pylibsrtp guard tests were
written for, and with itself (every locked package's own requirements are met by the lock, for
the image's Python on both architectures). Offline: `image/build lock` regenerates it; the
download of exactly these files, hashes checked, is image/build wheels (tests/prepare.d)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ruseon_appliance.engine import aiortc_internals
from ruseon_appliance.stream import srtp

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"
# image/build's Python for the image (Debian trixie's python3).
IMAGE_PYTHON = "3.13"


def locked() -> dict[str, tuple[str, list[str]]]:
    """``{canonical name: (version, [sha256 digests])}`` parsed as pip reads the file."""
    text = LOCK.read_text(encoding="utf-8")
    logical = re.sub(r"\\\n", " ", text)
    pins: dict[str, tuple[str, list[str]]] = {}
    for line in logical.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        name, sep, version = requirement.partition("==")
        assert sep and version, f"not pinned with ==: {line}"
        assert canonicalize_name(name) not in pins, f"{name} locked twice"
        digests = []
        for option in options:
            assert option.startswith("--hash=sha256:"), f"{name}: unexpected {option}"
            digests.append(option.removeprefix("--hash=sha256:"))
        pins[canonicalize_name(name)] = (version, digests)
    return pins


def project_requirements() -> list[Requirement]:
    with (REPO / "pyproject.toml").open("rb") as fh:
        return [Requirement(r) for r in tomllib.load(fh)["project"]["dependencies"]]


def test_every_pin_is_exact_with_sha256_hashes() -> None:
    pins = locked()
    assert len(pins) >= 20
    for name, (version, digests) in pins.items():
        Version(version)
        assert digests, f"{name} has no hash"
        assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests), name
        assert len(set(digests)) == len(digests), f"{name}: a hash twice"
    # A compiled package has one wheel per architecture: two hashes at least.
    for compiled in ("av", "aiohttp", "cryptography", "pylibsrtp", "numpy", "cffi"):
        assert len(pins[compiled][1]) >= 2, f"{compiled}: not both amd64 and arm64"


def test_every_dependency_of_pyproject_is_locked_within_its_range() -> None:
    pins = locked()
    for requirement in project_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in {LOCK.name}: run image/build lock"
        version = pins[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{LOCK.name} pins {name}=={version}, outside pyproject's {requirement}: "
            "run image/build lock")


def test_the_lock_pins_what_the_aiortc_guard_tests_were_written_for() -> None:
    pins = locked()
    assert pins["aiortc"][0] == aiortc_internals.AIORTC_VERSION
    assert pins["aioice"][0] == aiortc_internals.AIOICE_VERSION
    assert pins["pylibsrtp"][0] == srtp.PYLIBSRTP_VERSION


def test_the_dev_venv_runs_the_locked_versions() -> None:
    """The suite tests what the image installs: scripts/bootstrap-venv installs the lock's
    versions; a venv made before a lock change is stale (make re-runs the bootstrap)."""
    wrong = {}
    for name, (version, _) in locked().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "missing"
        if installed != version:
            wrong[name] = f"venv {installed}, lock {version}"
    assert not wrong, (f"the venv and {LOCK.name} disagree (make re-runs "
                       f"scripts/bootstrap-venv): {wrong}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_lock_is_closed_for_the_image_python(machine: str) -> None:
    """Installed with --no-deps, nothing else comes in: every locked package's requirements
    (read from its metadata in the venv, which has the same versions) are locked too, within
    range, with the markers evaluated for the image's Python on that machine."""
    pins = locked()
    environment = {**default_environment(), "python_version": IMAGE_PYTHON,
                   "python_full_version": f"{IMAGE_PYTHON}.5", "platform_machine": machine,
                   "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                   "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    requirements = [(r, "ruseon-appliance") for r in project_requirements()]
    for name in pins:
        requirements += [(Requirement(r), name)
                         for r in importlib.metadata.requires(name) or []]
    missing = []
    for requirement, wanted_by in requirements:
        if requirement.marker and not requirement.marker.evaluate({**environment, "extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name not in pins or not requirement.specifier.contains(pins[name][0],
                                                                  prereleases=True):
            missing.append(f"{wanted_by} needs {requirement} (lock: {pins.get(name, ('-',))[0]})")
    assert not missing, missing
