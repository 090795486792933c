"""Packet-loss tests and UDP GSO: make nftables see datagrams, not whole batches.

The fan-out sends each run of equal-sized packets in one ``sendmsg`` with ``UDP_SEGMENT``.
Loopback (and veth) carry such a send as one large packet all the way to the receiving socket,
so an nftables rule counts and drops whole batches (a frame at a time): a burst-loss model,
harsher than a wire, where the network card has already cut the batch into datagrams. With the
links' ``tx-udp-segmentation`` off, the kernel cuts it in software before the link, as it does
for a card without UDP segmentation offload, and a rule on the receiving side (``prerouting``)
sees one datagram at a time. Only ever called inside a test's private network namespace.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

LOSS_HOOK = "{ type filter hook prerouting priority 0 ; }"


def segment_udp_in_software() -> None:
    """Turn UDP segmentation offload off on every link of this (private) namespace."""
    ethtool = shutil.which("ethtool")
    if ethtool is None:
        pytest.fail("ethtool is needed for the packet-loss tests (scripts/install-system-deps)")
    links = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True,
                           text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        subprocess.run([ethtool, "-K", name, "tx-udp-segmentation", "off"],
                       capture_output=True, check=False)
    features = subprocess.run([ethtool, "-k", "lo"], check=True, capture_output=True,
                              text=True).stdout
    assert "tx-udp-segmentation: off" in features, features
