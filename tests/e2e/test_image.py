"""``image/build debian`` end to end: build the rootfs, drop a provisioning file on its boot
partition, boot it with systemd-nspawn, and check the first boot applied it and video flows.

The build reuses the systemd test's cached package rootfs (``--base``) and wheels (offline), so
it takes seconds, not minutes. The container shares the test's private network namespace.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aioice.ice
import pytest
from packaging.utils import canonicalize_name

from tests.e2e import nspawn
from tests.e2e.whep_viewer import WhepRefused, watch
from tests.test_lock import locked
from tests.tooling import free_port, require_root, require_tool

pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = nspawn.REPO
HOSTNAME = "ruseon-cam-7"
TOKEN = "t0ken-from-the-boot-partition"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyKeyForTheImageTestOnly0000000000 admin@ci"
IMAGE_USER = "pi"
WIFI_SSID = "Test Net 5"
WIFI_PSK = "correct horse battery staple"
NTP_SERVER = "ntp.example.lan"  # written to timesyncd's config, never asked (nspawn skips it)


@dataclass
class BootedImage:
    """The booted image and where its appliance listens."""

    container: nspawn.Container
    rootfs: Path
    http_port: int
    rtsp_port: int
    build_log: str
    # ``systemctl is-enabled`` of units in the built rootfs, before its first boot.
    enabled_before_boot: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def provisioning_file(http_port: int, rtc_port: int, rtsp_port: int) -> str:
    """The ruseon.toml an admin drops on the boot partition."""
    return f"""\
# Provisioning for one camera (applied and deleted on first boot).
[device]
hostname = "{HOSTNAME}"
ssh_authorized_keys = ["{SSH_KEY}"]
wifi_ssid = "{WIFI_SSID}"
wifi_psk = "{WIFI_PSK}"
wifi_country = "GB"

[time]
ntp = ["{NTP_SERVER}"]

[auth]
token = "{TOKEN}"
viewing = "credential"

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

# Where, not whether: the image's defaults turn RTSP (and ONVIF) on.
[rtsp]
listen = "127.0.0.1:{rtsp_port}"
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
        enabled = {
            unit: subprocess.run(
                ["systemctl", f"--root={rootfs}", "is-enabled", unit],
                capture_output=True, text=True, check=False,
            ).stdout.strip()
            for unit in ("ssh.service", "ruseon.service", "ruseon-growfs.service",
                         "systemd-timesyncd.service")
        }
        http_port, rtc_port, rtsp_port = free_port(), free_port(socket.SOCK_DGRAM), free_port()
        (rootfs / "boot/firmware/ruseon.toml").write_text(
            provisioning_file(http_port, rtc_port, rtsp_port))
        container = nspawn.Container(rootfs, log_path=out / "console.log")
        container.wait_booted()
        yield BootedImage(container, rootfs, http_port, rtsp_port, build.stdout, enabled)
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
    config = c.run("/opt/ruseon/bin/ruseon", "config", "--config", "/etc/ruseon/ruseon.toml",
                    "--show-secrets")
    assert f'token = "{TOKEN}"' in config.stdout
    assert 'source = "synthetic"' in config.stdout
    # The keys went to the image's real (locked) login user, not to root or a missing "admin".
    assert c.run("passwd", "--status", IMAGE_USER).stdout.split()[1] == "L"
    keys = f"/home/{IMAGE_USER}/.ssh/authorized_keys"
    assert SSH_KEY in c.run("cat", keys).stdout
    assert c.run("stat", "-c", "%a %U", keys).stdout.split() == ["600", IMAGE_USER]
    assert c.run("test", "-e", "/root/.ssh/authorized_keys", check=False).returncode == 1
    assert c.systemctl("is-enabled", "avahi-daemon.service", check=False).stdout.strip() == (
        "enabled"
    )
    # [time] ntp went to systemd-timesyncd, not into the appliance's config.
    assert c.run("cat", "/etc/systemd/timesyncd.conf.d/ruseon.conf").stdout.splitlines()[1:] == [
        "[Time]", f"NTP={NTP_SERVER}"]
    assert NTP_SERVER not in config.stdout and "NTP servers" in log, log


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


def test_the_image_answers_onvif_and_rtsp_by_default(booted_image: BootedImage) -> None:
    """An NVR adopts a flashed camera by itself: the image's defaults
    (/usr/lib/ruseon/defaults.toml) turn ONVIF and RTSP on under the provisioned ruseon.toml,
    which says nothing of either (only where RTSP listens)."""
    c = booted_image.container
    nspawn.wait_for(
        lambda: c.show("ruseon", "ActiveState")["ActiveState"] == "active", 60,
        "ruseon.service active",
    )
    config = c.run("/opt/ruseon/bin/ruseon", "config", "--config", "/etc/ruseon/ruseon.toml")
    sections = tomllib.loads(config.stdout)
    assert sections["onvif"]["enable"] is True and sections["rtsp"]["enable"] is True
    # ONVIF's one open call, as a client's first contact.
    body = (b'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body>'
            b'<GetSystemDateAndTime xmlns="http://www.onvif.org/ver10/device/wsdl"/>'
            b'</s:Body></s:Envelope>')
    request = urllib.request.Request(
        booted_image.url + "/onvif/device_service", data=body,
        headers={"Content-Type": "application/soap+xml; charset=utf-8"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = response.read().decode()
    assert response.status == 200 and "SystemDateAndTime" in answer, answer[:400]
    # The RTSP server the stream URIs point at.
    with socket.create_connection(("127.0.0.1", booted_image.rtsp_port), timeout=30) as sock:
        sock.sendall(b"OPTIONS rtsp://127.0.0.1/ RTSP/1.0\r\nCSeq: 1\r\n\r\n")
        reply = sock.recv(4096).decode()
    assert reply.startswith("RTSP/1.0 200") and "DESCRIBE" in reply, reply


def test_ssh_is_off_in_the_image_until_a_key_turns_it_on(booted_image: BootedImage) -> None:
    """The base enabled ssh.service (Debian's postinst, as rpi-image-gen's openssh-server layer);
    the appliance layer turned it off without --ssh; the provisioned key turned it on."""
    assert booted_image.enabled_before_boot["ssh.service"] == "disabled"
    assert booted_image.enabled_before_boot["ruseon.service"] == "enabled"
    assert "SSH server disabled (no --ssh)" in booted_image.build_log
    c = booted_image.container
    assert c.systemctl("is-enabled", "ssh.service", check=False).stdout.strip() == "enabled"
    log = (booted_image.rootfs / "boot/firmware/ruseon-firstboot.log").read_text()
    assert "SSH enabled" in log, log


def test_first_boot_wifi_targets_network_manager(booted_image: BootedImage) -> None:
    c = booted_image.container
    profile = "/etc/NetworkManager/system-connections/ruseon-wifi.nmconnection"
    assert c.run("stat", "-c", "%a %U", profile).stdout.split() == ["600", "root"]
    text = c.run("cat", profile).stdout
    for line in ("type=wifi", f"ssid={WIFI_SSID}", "key-mgmt=wpa-psk", f"psk={WIFI_PSK}"):
        assert line in text.splitlines(), text
    regdom = c.run("cat", "/etc/modprobe.d/cfg80211_regdomain.conf").stdout
    assert regdom.strip() == "options cfg80211 ieee80211_regdom=GB"
    log = (booted_image.rootfs / "boot/firmware/ruseon-firstboot.log").read_text()
    assert WIFI_PSK not in log


def test_root_growth_ran_once_and_left_the_containers_root_alone(booted_image: BootedImage) -> None:
    assert booted_image.enabled_before_boot["ruseon-growfs.service"] == "enabled"
    c = booted_image.container
    stamp = c.run("cat", "/var/lib/ruseon-growfs/done").stdout
    # systemd-nspawn: the root is the host's; a container never grows it.
    assert "systemd-nspawn container" in stamp and "not grown" in stamp, stamp
    assert c.show("ruseon-growfs", "Result")["Result"] == "success"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("[camera]\nwidth = 17\n", "camera.width"),
        ('[device]\nadmin_user = "admin"\nssh_authorized_keys = ["ssh-ed25519 AAAA x"]\n',
         "no such account"),
        ('[device]\nwifi_ssid = "x"\nwifi_psk = "short"\n', "wifi_psk"),
        ('[device]\nwifi_ssid = "x"\nwifi_country = "Britain"\n', "wifi_country"),
    ],
)
def test_an_invalid_file_is_set_aside_and_defaults_kept(
    booted_image: BootedImage, content: str, reason: str
) -> None:
    c = booted_image.container
    boot = booted_image.rootfs / "boot/firmware"
    before = c.run("cat", "/etc/ruseon/ruseon.toml").stdout
    (boot / "ruseon.toml.invalid").unlink(missing_ok=True)
    (boot / "ruseon.toml").write_text(content)
    c.systemctl("start", "ruseon-firstboot.service")
    assert (boot / "ruseon.toml.invalid").exists()
    assert not (boot / "ruseon.toml").exists()
    log = (boot / "ruseon-firstboot.log").read_text()
    assert "NOT applied" in log and reason in log, log
    assert c.run("cat", "/etc/ruseon/ruseon.toml").stdout == before


def test_image_scripts_are_shellcheck_and_yaml_clean() -> None:
    require_tool("shellcheck", "scripts/install-system-deps")
    subprocess.run(
        ["shellcheck", str(REPO / "image/build"), str(REPO / "image/layer/apply.sh"),
         str(REPO / "image/layer/network-manager.sh"), str(REPO / "image/layer/ruseon-growfs"),
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


# -- the rpi target's logic, with a stand-in for rpi-image-gen ------------------------------------
# rpi-image-gen cannot run here (x86, no Raspberry Pi archive), so a stand-in takes its place: it
# records its arguments, runs "hooks" the way rpi-image-gen does (in the -S source tree, where a
# relative path means something else), and writes the raw image where rpi-image-gen writes it:
# IGconf_image_outputdir = <-B work root>/image-<name>/<name>.img (layer/base/image-base.yaml).
STAND_IN = """#!/bin/bash
set -eu
echo "$@" > "$RECORD/argv"
src="" work="" cfg=""
while [ $# -gt 0 ]; do
    case "$1" in
        build) shift ;;
        -S) src=$2; shift 2 ;;
        -B) work=$2; shift 2 ;;
        -c) cfg=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "stand-in: unexpected $1" >&2; exit 2 ;;
    esac
done
for kv in "$@"; do export "${kv?}"; done
cd "$src"
test -f "config/$cfg"
test -f "$IGconf_ruseon_wheel" && echo "wheel found from $PWD" > "$RECORD/hook"
test -d "$IGconf_ruseon_wheels" && echo "wheels found" >> "$RECORD/hook"
echo "$IGconf_ruseon_repo" > "$RECORD/repo"
if [ "${STAND_IN_WRITES:-yes}" = yes ]; then
    mkdir -p "$work/image-ruseon"
    echo "raw image bytes" > "$work/image-ruseon/ruseon.img"
fi
"""


def run_rpi_build(tmp_path: Path, *extra: str, writes: bool = True
                  ) -> subprocess.CompletedProcess[str]:
    """``image/build rpi`` from ``tmp_path`` with relative paths and the stand-in."""
    require_root("image/build requires root")
    require_tool("xz", "scripts/install-system-deps")
    rig = tmp_path / "rig"
    rig.mkdir()
    (rig / "rpi-image-gen").write_text(STAND_IN)
    (rig / "rpi-image-gen").chmod(0o755)
    (tmp_path / "dist").mkdir()
    wheel = tmp_path / "dist/ruseon_appliance-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: the stand-in only checks it
    (tmp_path / "wheels").mkdir()
    (tmp_path / "record").mkdir()
    env = {**os.environ, "IMAGE_BUILD_HOST_CHECK": "0", "RECORD": str(tmp_path / "record"),
           "STAND_IN_WRITES": "yes" if writes else "no"}
    return subprocess.run(
        [str(REPO / "image/build"), "rpi", "--rpi-image-gen", "rig", "--device", "pi5",
         "--wheel", "dist/ruseon_appliance-0.1.0-py3-none-any.whl", "--wheels", "wheels",
         "--work", "work", "--out", "out", *extra],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path, env=env,
    )


def test_rpi_target_passes_a_work_root_and_reads_the_image_from_it(tmp_path: Path) -> None:
    result = run_rpi_build(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    argv = (tmp_path / "record/argv").read_text().split()
    # -B names the work root (absolute): nothing lands in <cwd>/work by default or in the repo.
    assert argv[argv.index("-B") + 1] == str(tmp_path / "work")
    # Relative --wheel/--wheels were made absolute before the hooks ran in the source tree.
    assert f"IGconf_ruseon_wheel={tmp_path}/dist/ruseon_appliance-0.1.0-py3-none-any.whl" in argv
    assert f"IGconf_ruseon_wheels={tmp_path}/wheels" in argv
    assert "IGconf_ruseon_ssh=n" in argv
    hook = (tmp_path / "record/hook").read_text()
    assert "wheel found" in hook and "wheels found" in hook and str(tmp_path) not in hook
    assert (tmp_path / "record/repo").read_text().strip() == str(REPO)
    images = list((tmp_path / "out").glob("ruseon-*.img.xz"))
    assert len(images) == 1, list((tmp_path / "out").iterdir())
    raw = subprocess.run(["xz", "-dc", str(images[0])], capture_output=True, check=True).stdout
    assert raw == b"raw image bytes\n"
    sha = images[0].with_name(images[0].name + ".sha256").read_text()
    assert images[0].name in sha
    # The device layer was chosen in the copied config, not in the repository's.
    assert "layer: rpi4" in (REPO / "image/rpi/config/ruseon.yaml").read_text()


def test_rpi_target_says_where_it_looked_when_no_image_came_out(tmp_path: Path) -> None:
    result = run_rpi_build(tmp_path, writes=False)
    assert result.returncode == 1
    expected = f"wrote no {tmp_path}/work/image-ruseon/ruseon.img"
    assert expected in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.img.xz"))


def test_rpi_target_refuses_a_work_root_inside_the_checkout(tmp_path: Path) -> None:
    require_root("image/build requires root")
    result = subprocess.run(
        [str(REPO / "image/build"), "check", "rpi", "--rpi-image-gen", str(tmp_path),
         "--work", str(REPO / "work")],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
        env={**os.environ, "IMAGE_BUILD_HOST_CHECK": "0"},
    )
    assert result.returncode == 1
    assert "is inside this checkout" in result.stderr, result.stderr
    assert not (REPO / "work").exists()


def test_network_manager_becomes_the_one_stack(tmp_path: Path) -> None:
    """What trixie-minbase and the device layer leave, then network-manager.sh (as upstream's
    CM5 jig layer): .network files gone, networkd and iwd masked, NetworkManager enabled."""
    require_tool("systemctl", "scripts/install-system-deps")
    rootfs = tmp_path / "rootfs"
    network = rootfs / "etc/systemd/network"
    network.mkdir(parents=True)
    for name in ("01-eth0.network", "02-wlan0.network"):
        (network / name).write_text("[Match]\nName=x\n[Network]\nDHCP=yes\n")
    (network / "99-default.link").symlink_to("/dev/null")
    units = rootfs / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    (units / "NetworkManager.service").write_text(
        "[Service]\nExecStart=/usr/sbin/NetworkManager\n[Install]\nWantedBy=multi-user.target\n")
    subprocess.run([str(REPO / "image/layer/network-manager.sh"), str(rootfs)], check=True,
                   capture_output=True)
    assert sorted(p.name for p in network.iterdir()) == ["99-default.link"]
    system = rootfs / "etc/systemd/system"
    for unit in ("systemd-networkd.service", "systemd-networkd.socket",
                 "systemd-networkd-wait-online.service", "iwd.service"):
        assert os.readlink(system / unit) == "/dev/null", unit
    assert (system / "multi-user.target.wants/NetworkManager.service").is_symlink()
    assert oct((rootfs / "etc/NetworkManager/system-connections").stat().st_mode & 0o777) == "0o700"


def test_rpi_layer_wires_user_wheels_network_and_ssh() -> None:
    """The layer YAML passes what apply.sh needs; its metadata declares every variable used."""
    import yaml

    layer_text = (REPO / "image/rpi/layer/ruseon-appliance.yaml").read_text()
    layer = yaml.safe_load(layer_text.split("\n---\n", 1)[1])
    (hook,) = layer["mmdebstrap"]["customize-hooks"]
    for part in ('--wheel "$IGconf_ruseon_wheel"', '--wheels "$IGconf_ruseon_wheels"',
                 '--admin-user "$IGconf_device_user1"', "--network-manager", "--ssh"):
        assert part in hook, hook
    packages = layer["mmdebstrap"]["packages"]
    for package in ("network-manager", "wpasupplicant", "cloud-guest-utils", "python3-picamera2"):
        assert package in packages
    for var in ("repo", "wheel", "wheels", "ssh"):
        assert f"# X-Env-Var-{var}:" in layer_text or f"# X-Env-Var-{var}: " in layer_text
    assert "systemd-net-min" not in layer_text.split("X-Env-Layer-Requires:", 1)[1].split("\n")[0]
    config = yaml.safe_load((REPO / "image/rpi/config/ruseon.yaml").read_text())
    assert config["include"]["file"] == "trixie-minbase.yaml"
    assert config["device"]["user1"] == "pi"
    assert config["layer"]["app"] == "ruseon-appliance"



def test_the_image_keeps_time_without_waiting_for_it() -> None:
    """systemd-timesyncd is in both targets and enabled with its clock file seeded; the service
    does not wait for NTP (a board on a LAN without it would never start recording)."""
    import yaml

    layer_text = (REPO / "image/rpi/layer/ruseon-appliance.yaml").read_text()
    layer = yaml.safe_load(layer_text.split("\n---\n", 1)[1])
    assert "systemd-timesyncd" in layer["mmdebstrap"]["packages"]
    packages = (REPO / "image/debian/packages").read_text().split()
    assert "systemd-timesyncd" in packages
    apply = (REPO / "image/layer/apply.sh").read_text()
    assert "systemctl enable systemd-timesyncd.service" in apply
    assert 'touch "$rootfs/var/lib/systemd/timesync/clock" "$rootfs/usr/lib/clock-epoch"' in apply
    unit = (REPO / "systemd/ruseon.service").read_text()
    assert "time-sync.target" not in unit and "time-set.target" not in unit


def test_first_boot_writes_the_ntp_servers_of_the_time_table(tmp_path: Path) -> None:
    """``[time] ntp = [...]`` goes to a timesyncd drop-in, not into the appliance's config
    (whose loader would refuse an unknown table); bad values are refused before writing."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader(
        "ruseon_firstboot", str(REPO / "image/layer/ruseon-firstboot"))
    spec = importlib.util.spec_from_loader("ruseon_firstboot", loader)
    assert spec is not None
    firstboot = importlib.util.module_from_spec(spec)
    loader.exec_module(firstboot)
    text = ('[auth]\ntoken = "t"\n\n[time]\nntp = ["ntp.example.lan", "192.0.2.123"]\n\n'
            '[camera]\nwidth = 640\n')
    appliance, _ = firstboot.split_device_table(text)
    assert "[time]" not in appliance and "ntp" not in appliance and "[camera]" in appliance
    assert firstboot.check_time({"ntp": ["ntp.example.lan", "192.0.2.123"]}) == [
        "ntp.example.lan", "192.0.2.123"]
    for bad in ({"ntp": "one"}, {"ntp": ["a b"]}, {"servers": []}):
        with pytest.raises(firstboot.ProvisioningError):
            firstboot.check_time(bad)
    firstboot.TIMESYNCD_DROPIN = tmp_path / "timesyncd.conf.d/ruseon.conf"
    notes: list[str] = []
    firstboot.apply_time(["ntp.example.lan", "192.0.2.123"], notes)
    assert firstboot.TIMESYNCD_DROPIN.read_text().splitlines()[1:] == [
        "[Time]", "NTP=ntp.example.lan 192.0.2.123"]


def test_the_built_image_has_timesyncd_enabled_and_its_clock_file(
        booted_image: BootedImage) -> None:
    """In the built rootfs (before boot): timesyncd enabled, its clock file and
    /usr/lib/clock-epoch are there (seeded at the build: the first boot starts no earlier)."""
    assert booted_image.enabled_before_boot["systemd-timesyncd.service"] == "enabled"
    assert "systemd-timesyncd enabled" in booted_image.build_log
    rootfs = booted_image.rootfs
    for seeded in ("var/lib/systemd/timesync/clock", "usr/lib/clock-epoch"):
        assert (rootfs / seeded).is_file(), seeded
    owner = booted_image.container.run(
        "stat", "-c", "%U", "/var/lib/systemd/timesync/clock").stdout.strip()
    assert owner == "systemd-timesync", owner


def test_the_image_installs_exactly_the_lock_and_records_it_with_the_commit(
        booted_image: BootedImage) -> None:
    """install.sh --lock: every locked wheel, hashes checked; numpy is the venv's locked wheel,
    not the OS's python3-numpy. /etc/ruseon/build-info names the commit and the lock."""
    assert "install.sh: installing the dependencies pinned in requirements.lock (hashes checked)" \
        in booted_image.build_log, booted_image.build_log
    pins = {name: version for name, (version, _) in locked().items()}
    listed = booted_image.container.run("/opt/ruseon/bin/pip", "list", "--format=json",
                                        "--disable-pip-version-check").stdout
    installed = {canonicalize_name(p["name"]): p["version"] for p in json.loads(listed)}
    wrong = {name: (installed.get(name), version) for name, version in pins.items()
             if installed.get(name) != version}
    assert not wrong, f"image venv vs lock: {wrong}"
    numpy = booted_image.container.run("/opt/ruseon/bin/python", "-c",
                                       "import numpy; print(numpy.__file__)").stdout
    assert numpy.startswith("/opt/ruseon/lib/"), numpy
    rootfs = booted_image.rootfs
    lock = nspawn.LOCK_FILE.read_bytes()
    assert (rootfs / "usr/lib/ruseon/requirements.lock").read_bytes() == lock
    info = tomllib.loads((rootfs / "etc/ruseon/build-info").read_text())
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout.strip() != ""
    assert (info["commit"], info["commit_dirty"]) == (commit, dirty)
    assert info["lock_sha256"] == hashlib.sha256(lock).hexdigest()
    assert info["arch"] == "amd64" and info["version"] == nspawn.project_version()
    assert {canonicalize_name(n): v for n, v in info["packages"].items()} == pins


def test_status_shows_the_build_to_the_admin_and_not_to_a_stranger(
        booted_image: BootedImage) -> None:
    """From outside the machine: /api/status without a credential is refused and says nothing
    of the build; with the admin secret (auth.token here) it has the image's commit."""
    c = booted_image.container
    nspawn.wait_for(lambda: c.show("ruseon", "ActiveState")["ActiveState"] == "active", 60,
                    "ruseon.service active")
    commit = tomllib.loads((booted_image.rootfs / "etc/ruseon/build-info").read_text())["commit"]
    url = booted_image.url + "/api/status"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 401
    assert commit not in refused.value.read().decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        status = json.load(response)
    assert status["access"]["role"] == "admin"
    assert status["build"]["commit"] == commit
    assert status["build"]["packages"]["aiortc"] == locked()["aiortc"][0]
