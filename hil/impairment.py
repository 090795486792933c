"""Added delay for the simulated rig: an NFQUEUE helper (the kernel here has no ``netem``).

``start_delay`` runs ``python -m hil.impairment`` inside the device namespace. The helper binds an
NFQUEUE, then adds iptables rules that queue every UDP packet (WebRTC) entering or leaving the
device, and gives each packet its ACCEPT verdict ``delay_ms`` later: each direction gets the delay,
so the round trip grows by twice that. Needs PyPI ``NetfilterQueue`` (built against
``libnetfilter-queue-dev``) and apt ``iptables``; without them, ``--delay-ms`` fails with a
message saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

QUEUE_NUM = 7
READY_FILE = "delay.ready"


def queue_rules(queue_num: int, action: str = "-A") -> list[list[str]]:
    """iptables commands sending UDP in both directions to ``queue_num`` (``-D`` removes them).

    The kernel here has the xtables NFQUEUE target but not nftables' ``queue`` expression
    (CONFIG_NFT_QUEUE unset), so this one rule set uses iptables (its nft backend).
    """
    return [["iptables", action, chain, "-p", "udp", "-j", "NFQUEUE", "--queue-num",
             str(queue_num)] for chain in ("INPUT", "OUTPUT")]


def start_delay(namespace: str, delay_ms: float, work_dir: Path) -> subprocess.Popen[bytes]:
    """Start the helper in ``namespace``; return once it is queueing (raise if it cannot)."""
    try:
        import netfilterqueue  # noqa: F401
    except ImportError:
        raise SystemExit("hil: --delay-ms needs PyPI NetfilterQueue (pip install NetfilterQueue; "
                         "it builds against apt libnetfilter-queue-dev)") from None
    if shutil.which("iptables") is None:
        raise SystemExit("hil: --delay-ms needs iptables (apt install iptables): the NFQUEUE "
                         "target is reached through it")
    ready = work_dir / READY_FILE
    log = (work_dir / "delay.log").open("wb")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", namespace, sys.executable, "-m", "hil.impairment",
         "--delay-ms", str(delay_ms), "--ready", str(ready)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 15
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("hil: the NFQUEUE delay helper did not start; see "
                             f"{work_dir / 'delay.log'}")
        time.sleep(0.1)
    return proc


async def _serve(delay_s: float, ready: Path) -> None:
    from netfilterqueue import NetfilterQueue

    loop = asyncio.get_running_loop()
    nfq = NetfilterQueue()

    def on_packet(packet: object) -> None:
        # The verdict may be given after the callback returns: hold the packet, then accept.
        loop.call_later(delay_s, packet.accept)  # type: ignore[attr-defined]

    nfq.bind(QUEUE_NUM, on_packet, max_len=8192)
    for rule in queue_rules(QUEUE_NUM):
        subprocess.run(rule, check=True)
    loop.add_reader(nfq.get_fd(), lambda: nfq.run(block=False))
    ready.write_text("ok\n")
    try:
        await asyncio.Event().wait()
    finally:
        for rule in queue_rules(QUEUE_NUM, "-D"):
            subprocess.run(rule, check=False)
        nfq.unbind()


def main() -> None:
    """Entry point of the helper (inside the device namespace)."""
    parser = argparse.ArgumentParser(prog="hil.impairment")
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.delay_ms / 1000.0, args.ready))


if __name__ == "__main__":
    main()
