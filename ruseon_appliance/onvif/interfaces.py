"""The network interface the device answers on: its name, MAC and IPv4 address (Linux).

Home Assistant takes the MAC of ``GetNetworkInterfaces`` as the camera's unique id, so it
must be the real one of the interface the HTTP server listens on: the interface holding the
configured address, or for a wildcard address the one of the default route. Loopback has no
MAC (all zeros): there a stable locally administered one derived from the device's serial
stands in, so a unique id never collides with another device's.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

# ioctls, not /sys/class/net: sysfs shows the network namespace that mounted it, these the
# process's own (a container's or a test's namespace).
_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B
_SIOCGIFHWADDR = 0x8927
_SIOCGIFMTU = 0x8921


@dataclass(frozen=True, slots=True)
class Interface:
    """An interface as ``GetNetworkInterfaces`` reports it."""

    name: str
    mac: str
    address: str
    prefix_length: int
    mtu: int
    real_mac: bool  # False: the MAC is derived (loopback or no hardware address)


def _ioctl(name: str, request: int) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None


def _ioctl_address(name: str, request: int) -> str | None:
    packed = _ioctl(name, request)
    return socket.inet_ntoa(packed[20:24]) if packed is not None else None


def _hardware_address(name: str) -> str:
    packed = _ioctl(name, _SIOCGIFHWADDR)
    return ":".join(f"{b:02x}" for b in packed[18:24]) if packed is not None else ""


def _mtu(name: str) -> int:
    packed = _ioctl(name, _SIOCGIFMTU)
    return struct.unpack("i", packed[16:20])[0] if packed is not None else 1500


def _default_route_interface() -> str | None:
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def derived_mac(serial: str) -> str:
    """A stable, locally administered unicast MAC from ``serial``."""
    digest = bytearray(hashlib.sha256(serial.encode()).digest()[:6])
    digest[0] = (digest[0] & 0xFC) | 0x02
    return ":".join(f"{b:02x}" for b in digest)


def interface_for(host: str, serial: str) -> Interface:
    """The interface of listen address ``host`` (wildcard: the default route's)."""
    names = sorted(name for _, name in socket.if_nameindex())
    chosen: str | None = None
    if host in ("", "0.0.0.0", "::"):
        chosen = _default_route_interface()
    else:
        for name in names:
            if _ioctl_address(name, _SIOCGIFADDR) == host:
                chosen = name
                break
    if chosen is None:
        chosen = "lo" if "lo" in names or not names else names[0]
    address = _ioctl_address(chosen, _SIOCGIFADDR) or (host if host not in ("", "0.0.0.0", "::")
                                                       else "127.0.0.1")
    netmask = _ioctl_address(chosen, _SIOCGIFNETMASK) or "255.0.0.0"
    try:
        prefix = ipaddress.IPv4Network(f"0.0.0.0/{netmask}").prefixlen
    except ValueError:
        prefix = 8
    mac = _hardware_address(chosen)
    real = bool(mac) and mac != "00:00:00:00:00:00"
    mtu = _mtu(chosen)
    return Interface(chosen, mac if real else derived_mac(serial), address, prefix, mtu, real)
