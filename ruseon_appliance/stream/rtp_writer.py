"""The per-packet hot loop: one SSRC's media packets written, protected in place and batched.

Packets are written one behind the other into a shared batch buffer (the whole header in one
``pack_into`` of the stream's :class:`RtpHeaderTemplate`, the payload copied behind it),
protected in place with libsrtp (``stream/srtp.py``), and every batch of equal-sized packets
(``PacketizedFrame.ends``) leaves in one ``sendmsg`` with ``UDP_SEGMENT`` (``stream/gso.py``):
one syscall per batch instead of one per packet. No awaits, no per-packet objects; everything
the loop touches is a local. The send budget is passed in and handed back (its tokens), so the
loop also stops where the budget ends, packet-exact.
"""

from __future__ import annotations

import random
import socket
from typing import Any

from ruseon_appliance.stream.gso import GSO_MAX_BYTES, GSO_MAX_SEGMENTS, DropCounters, GsoSender
from ruseon_appliance.stream.history import PacketizedFrame
from ruseon_appliance.stream.rtp_header import FIXED, RtpHeaderTemplate
from ruseon_appliance.stream.srtp import SRTP_OK, SrtpPacketBuffer, srtp_protect_in_place

# The payload of a padding-only RTP packet (RFC 3550 5.1: the last octet counts the padding).
LEADING_PADDING = b"\x00\x00\x00\x04"


class SrtpPacketWriter:
    """Writes one stream's RTP packets (``header``: its PT, SSRC and extensions) protected with
    the libsrtp session ``srtp_handle``, into buffers the send loop shares (it is
    single-threaded and sends at once), through its GSO sender. Losses are counted on
    ``drops``."""

    def __init__(self, header: RtpHeaderTemplate, srtp_handle: Any, *, batch: SrtpPacketBuffer,
                 single: SrtpPacketBuffer, gso: GsoSender, drops: DropCounters) -> None:
        self.header = header
        self._handle = srtp_handle
        self._batch = batch
        self._single = single
        self._gso = gso
        self.drops = drops
        self.seq = random.randrange(0, 32768)  # lower half, as aiortc: no early SRTP ROC wrap

    def send_padding(self, sock: socket.socket, addr: tuple[str, int], timestamp: int) -> None:
        """One padding-only packet (the P bit set, no media), taking a sequence number."""
        buffer = self._single
        view = buffer.view
        tpl = self.header
        header = tpl.header_now()
        hl = len(header)
        view[0:hl] = header
        view[0] = header[0] | 0x20  # P bit: the payload is all padding
        FIXED.pack_into(view, 1, tpl.payload_type, self.seq, timestamp, tpl.ssrc)
        view[hl:hl + len(LEADING_PADDING)] = LEADING_PADDING
        buffer.length[0] = hl + len(LEADING_PADDING)
        if srtp_protect_in_place(self._handle, buffer.cdata, buffer.length) == SRTP_OK:
            try:
                sock.sendto(view[:buffer.length[0]], addr)
            except OSError:
                self.drops.send_errors += 1
        self.seq = (self.seq + 1) & 0xFFFF

    def send_payload(self, payload: bytes, timestamp: int, marker: bool,
                     sock: socket.socket, addr: tuple[str, int]) -> bool:
        """One packet carrying the whole of ``payload`` (an audio frame); False if it was
        refused by SRTP or the socket (counted on :attr:`drops`)."""
        buffer = self._single
        view = buffer.view
        tpl = self.header
        hl = tpl.struct.size
        n = hl + len(payload)
        tpl.struct.pack_into(view, 0, tpl.b0, (0x80 | tpl.payload_type) if marker
                             else tpl.payload_type, self.seq, timestamp, tpl.ssrc,
                             tpl.extensions_now())
        view[hl:n] = payload
        buffer.length[0] = n
        self.seq = (self.seq + 1) & 0xFFFF
        if srtp_protect_in_place(self._handle, buffer.cdata, buffer.length) != SRTP_OK:
            self.drops.send_errors += 1
            return False
        try:
            sock.sendto(view[:buffer.length[0]], addr)
        except BlockingIOError:
            self.drops.send_dropped_full += 1
            return False
        except OSError:
            self.drops.send_errors += 1
            return False
        return True

    def send_frame(self, frame: PacketizedFrame, timestamp: int, start: int, tokens: float,
                   sock: socket.socket, addr: tuple[str, int]) -> tuple[int, float, int]:
        """Send packets ``start ..`` of ``frame`` stamped ``timestamp`` while ``tokens`` (payload
        bytes) last. Returns the index of the first packet not sent (``len(frame.payloads)``
        when the frame is out), the tokens left and the payload octets sent."""
        payloads = frame.payloads
        last = len(payloads) - 1
        tpl = self.header
        ext = tpl.extensions_now()  # abs-send-time: once per frame
        buffer = self._batch
        view = buffer.view
        cdata = buffer.cdata
        length = buffer.length
        protect = srtp_protect_in_place
        handle = self._handle
        ok = SRTP_OK
        pack_into = tpl.struct.pack_into
        b0 = tpl.b0
        hl = tpl.struct.size
        pt = tpl.payload_type
        ssrc = tpl.ssrc
        send = self._gso.send
        drops = self.drops
        seq = self.seq
        octets = 0
        i = start
        starved = False
        for end in frame.ends:
            # One batch of equal-sized packets: i .. end-1, in as many sends as it takes.
            while i < end:
                offset = 0
                count = 0
                segment = 0
                while i < end and count < GSO_MAX_SEGMENTS:
                    payload = payloads[i]
                    size = len(payload)
                    if tokens < size:
                        starved = True
                        break
                    n = offset + hl + size
                    if n + 32 > GSO_MAX_BYTES:
                        break
                    pack_into(view, offset, b0, (0x80 | pt) if i == last else pt, seq,
                              timestamp, ssrc, ext)
                    view[offset + hl:n] = payload
                    length[0] = n - offset
                    if protect(handle, cdata + offset, length) == ok:
                        if not count:
                            segment = length[0]
                        offset += length[0]
                        count += 1
                    else:
                        drops.send_errors += 1  # lost like on the wire: a NACK recovers it
                    tokens -= size
                    octets += size
                    seq = (seq + 1) & 0xFFFF
                    i += 1
                if count:
                    send(drops, sock, addr, view, offset, segment, count)
                if starved:
                    break
            if starved:
                break
        self.seq = seq
        return i, tokens, octets
