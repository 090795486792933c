"""WS-Discovery (2005/04, as ONVIF uses it) responder: how NVRs and Home Assistant find the device.

A UDP socket bound to the group ``239.255.255.250:3702`` and joined only on the interface of
the HTTP listen address (a wildcard address: the default interface) hears multicast Probes;
one matching ``NetworkVideoTransmitter`` (or no type) and the Streaming scope (or no scope) is
answered with a unicast ProbeMatch whose XAddrs is the device service. ``Hello`` is multicast
on start and ``Bye`` on stop. A datagram that is oversized, not a SOAP Probe or without a
MessageID is dropped; answers are bounded per second overall and per sender, so a forged
source address cannot turn the device into an amplifier.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from typing import Any
from xml.sax.saxutils import escape

from ruseon_appliance.onvif.device import DEVICE_PATH, Identity
from ruseon_appliance.onvif.soap import SOAP_ENV, SoapFault, parse

log = logging.getLogger(__name__)

GROUP = "239.255.255.250"
PORT = 3702
MAX_DATAGRAM = 4096
ANSWERS_PER_S = 20
ANSWERS_PER_SENDER_PER_S = 4
WSA = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
WSD = "http://schemas.xmlsoap.org/ws/2005/04/discovery"
DN = "http://www.onvif.org/ver10/network/wsdl"
TDS = "http://www.onvif.org/ver10/device/wsdl"
ANONYMOUS = "http://schemas.xmlsoap.org/ws/2004/08/addressing/role/anonymous"
TYPES = ("NetworkVideoTransmitter", "Device")


def scope_matches(wanted: str, scopes: Sequence[str]) -> bool:
    """RFC 3986 matching (WS-Discovery's default): ``wanted`` equals a scope or is a prefix of
    it ending at a path segment."""
    wanted = wanted.rstrip("/")
    return any(s == wanted or s.startswith(wanted + "/") for s in scopes)


class DiscoveryResponder(asyncio.DatagramProtocol):
    """Answers Probes for the device (see the module docstring)."""

    def __init__(self, identity: Identity, *, listen_host: str, http_port: int,
                 scheme: str = "http", clock: Callable[[], float] = time.monotonic) -> None:
        self.identity = identity
        self.listen_host = listen_host
        self.http_port = http_port
        self.scheme = scheme
        self.clock = clock
        self.transport: asyncio.DatagramTransport | None = None
        self._sender: socket.socket | None = None
        self._window = 0.0
        self._answered = 0
        self._per_sender: dict[str, int] = {}
        self.probes = 0
        self.matches = 0
        self.ignored = 0
        self.limited = 0
        self.message_number = 0

    # --- lifecycle ----------------------------------------------------------------------

    def _interface(self) -> str:
        host = self.listen_host
        return "0.0.0.0" if host in ("", "0.0.0.0", "::") else host

    async def start(self) -> None:
        """Bind, join the group on the listen interface, and announce Hello."""
        interface = self._interface()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "IP_MULTICAST_ALL"):  # only the group this socket joined
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_ALL, 0)
        sock.bind((GROUP, PORT))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                        struct.pack("4s4s", socket.inet_aton(GROUP), socket.inet_aton(interface)))
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, sock=sock)
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        sender.bind((interface, 0))
        sender.setblocking(False)
        self._sender = sender
        self._multicast(self._announcement("Hello"))
        log.info("onvif: WS-Discovery answers on %s:%d (interface %s)", GROUP, PORT, interface,
                 extra={"EVENT": "onvif_discovery"})

    def stop(self) -> None:
        """Announce Bye and close."""
        if self._sender is not None:
            self._multicast(self._announcement("Bye"))
            self._sender.close()
            self._sender = None
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.DatagramTransport)
        self.transport = transport

    # --- probes -------------------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        host, port = str(addr[0]), int(addr[1])
        if len(data) > MAX_DATAGRAM or port == 0:
            self.ignored += 1
            return
        try:
            soap = parse(data)
        except SoapFault:
            self.ignored += 1
            return
        if soap.namespace != WSD or soap.operation != "Probe" or soap.header is None:
            self.ignored += 1  # Hello/Bye of others, Resolve, junk
            return
        message_id = (soap.header.findtext(f"{{{WSA}}}MessageID") or "").strip()
        if not message_id or len(message_id) > 256:
            self.ignored += 1
            return
        self.probes += 1
        if not self._matches(soap.body):
            return
        if not self._allowed(host):
            self.limited += 1
            return
        xaddr = self._xaddr(host)
        self.matches += 1
        self._send(self._probe_match(message_id, xaddr), (host, port))

    def _matches(self, probe: ET.Element) -> bool:
        types = (probe.findtext(f"{{{WSD}}}Types") or "").split()
        if types and not any(t.rpartition(":")[2] in TYPES for t in types):
            return False
        scopes = probe.find(f"{{{WSD}}}Scopes")
        wanted = (scopes.text or "").split() if scopes is not None else []
        mine = self.identity.scopes()
        return all(scope_matches(w, mine) for w in wanted)

    def _allowed(self, host: str) -> bool:
        now = self.clock()
        if now - self._window >= 1.0:
            self._window, self._answered = now, 0
            self._per_sender.clear()
        if self._answered >= ANSWERS_PER_S:
            return False
        if self._per_sender.get(host, 0) >= ANSWERS_PER_SENDER_PER_S:
            return False
        self._answered += 1
        self._per_sender[host] = self._per_sender.get(host, 0) + 1
        return True

    def _xaddr(self, peer: str) -> str:
        """The device service as ``peer`` reaches it: the address of the listen interface
        (for a wildcard: the source address the route to ``peer`` takes)."""
        host = self._interface()
        if host == "0.0.0.0":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                try:
                    probe.connect((peer, PORT))  # no datagram is sent: a route lookup
                    host = probe.getsockname()[0]
                except OSError:
                    host = "127.0.0.1"
        return f"{self.scheme}://{host}:{self.http_port}{DEVICE_PATH}"

    # --- messages -----------------------------------------------------------------------

    def _header(self, action: str, to: str, relates_to: str = "") -> str:
        self.message_number += 1
        relates = f"<a:RelatesTo>{escape(relates_to)}</a:RelatesTo>" if relates_to else ""
        return (f"<s:Header><a:Action>{WSD}/{action}</a:Action>"
                f"<a:MessageID>urn:uuid:{uuid.uuid4()}</a:MessageID>{relates}<a:To>{to}</a:To>"
                f'<d:AppSequence InstanceId="{int(time.time())}" '
                f'MessageNumber="{self.message_number}"/></s:Header>')

    def _endpoint(self, xaddr: str | None) -> str:
        scopes = " ".join(escape(s) for s in self.identity.scopes())
        out = (f"<a:EndpointReference><a:Address>{self.identity.endpoint}</a:Address>"
               f"</a:EndpointReference><d:Types>dn:NetworkVideoTransmitter tds:Device</d:Types>"
               f"<d:Scopes>{scopes}</d:Scopes>")
        if xaddr is not None:
            out += f"<d:XAddrs>{escape(xaddr)}</d:XAddrs>"
        return out + "<d:MetadataVersion>1</d:MetadataVersion>"

    def _envelope(self, header: str, body: str) -> bytes:
        return (f'<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="{SOAP_ENV}" '
                f'xmlns:a="{WSA}" xmlns:d="{WSD}" xmlns:dn="{DN}" xmlns:tds="{TDS}">'
                f"{header}<s:Body>{body}</s:Body></s:Envelope>").encode()

    def _probe_match(self, relates_to: str, xaddr: str) -> bytes:
        return self._envelope(self._header("ProbeMatches", ANONYMOUS, relates_to),
                              f"<d:ProbeMatches><d:ProbeMatch>{self._endpoint(xaddr)}"
                              "</d:ProbeMatch></d:ProbeMatches>")

    def _announcement(self, kind: str) -> bytes:
        xaddr = None if kind == "Bye" else self._xaddr("224.0.0.1")
        return self._envelope(self._header(kind, "urn:schemas-xmlsoap-org:ws:2005:04:discovery"),
                              f"<d:{kind}>{self._endpoint(xaddr)}</d:{kind}>")

    def _multicast(self, data: bytes) -> None:
        self._send(data, (GROUP, PORT))

    def _send(self, data: bytes, addr: tuple[str, int]) -> None:
        if self._sender is None:
            return
        try:
            self._sender.sendto(data, addr)
        except OSError as exc:
            log.debug("onvif: WS-Discovery send to %s failed: %s", addr, exc)

    def stats(self) -> dict[str, int]:
        """Counters for ``/api/status``."""
        return {"probes": self.probes, "matches": self.matches, "ignored": self.ignored,
                "rate_limited": self.limited}
