"""Offers first: while the engine answers offers, the work that can wait, waits (bounded).

A burst of offers (a wall of displays reloading, thirty viewers opening the page at once) is
answered one offer at a time, in arrival order (the engine's answer lock), so anything else the
loop does meanwhile delays every answer still to come. Two kinds of work can wait a few
milliseconds without harm:

- **New viewers' datagrams on the shared UDP port.** Viewers answered first start ICE checks
  (and, built, DTLS handshakes: a millisecond or more of Python and OpenSSL per viewer) while
  later offers are still being answered. While offers are pending the mux keeps what viewers
  not connected yet send (``UdpMux.pause_reading``: not lost, nothing to retransmit) and
  handles it, in arrival order, the moment the last pending offer is answered. Connected
  viewers' datagrams are never held: their RTCP (NACKs, keyframe requests) and consent checks
  are handled at once (issue 31; ``bench/pion.py --appliance default hold-all`` compares the
  hold that read nothing at all: the same join figures).
- **The cyclic garbage collector.** Answering one offer allocates a few thousand objects, so a
  burst of 30 triggers about seven young collections and, every few bursts, an older one that
  walks the whole heap (tens of ms; measured 2-3.5 ms of CPU per 30-offer burst,
  and a full collection in one burst of fifteen). Automatic collection is paused while offers
  are pending and resumed after, when the collection it owes runs at once.

Both are bounded: after :data:`MAX_HOLD_S` (0.25 s) of continuous answering (offers arriving
without a pause) everything resumes, and nothing is held again until the engine has been idle
once, so a steady stream of offers cannot starve connected viewers' RTCP/consent or let the
heap grow.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Protocol

# Longest the engine holds datagrams and the collector back for one burst of offers: a 30-offer
# burst is about 18 ms of CPU here (several times that on a Pi, and longer still in wall time on
# a busy machine: 0.1 s ran out under load), below what a peer's STUN or DTLS retransmission
# timer (500 ms and up) or consent freshness (seconds) would notice.
MAX_HOLD_S = 0.25


class PausableReader(Protocol):
    """What :class:`OfferBurst` needs from the UDP mux."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class OfferBurst:
    """Holds new viewers' datagrams and the garbage collector while offers are being answered.

    The engine calls :meth:`begin` when it starts answering an offer with none pending and
    :meth:`end` when the last pending offer is done (answered or refused)."""

    def __init__(self, reader: PausableReader, max_hold_s: float | None = None) -> None:
        self._reader = reader
        self._max_hold_s = MAX_HOLD_S if max_hold_s is None else max_hold_s
        self._timer: asyncio.TimerHandle | None = None
        self._reading_paused = False
        # Whether this object turned automatic collection off (and so must turn it back on):
        # if someone else disabled it, leave it alone.
        self._gc_paused = False
        self._gc_resume: asyncio.Handle | None = None
        # Set when a hold ran out with offers still pending; cleared by end().
        self._spent = False
        self.holds = 0
        self.holds_expired = 0

    @property
    def holding(self) -> bool:
        """Whether datagrams and the collector are being held now."""
        return self._timer is not None

    def begin(self) -> None:
        """Offers are being answered: hold, unless a hold already ran out in this burst."""
        if self._timer is not None or self._spent:
            return
        self.holds += 1
        self._reader.pause_reading()
        self._reading_paused = True
        if self._gc_resume is not None:
            # The previous burst's collector is still off (its resume had not run yet).
            self._gc_resume.cancel()
            self._gc_resume = None
        elif gc.isenabled():
            gc.disable()
            self._gc_paused = True
        self._timer = asyncio.get_running_loop().call_later(self._max_hold_s, self._expire)

    def end(self) -> None:
        """No offer is pending any more: resume (and allow the next burst to hold)."""
        self._spent = False
        self._resume()

    def _expire(self) -> None:
        self._timer = None
        self.holds_expired += 1
        self._spent = True
        self._resume()

    def _resume(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._reading_paused:
            self._reading_paused = False
            self._reader.resume_reading()
        if self._gc_paused and self._gc_resume is None:
            # Not before the answers finished in this loop iteration are written: the
            # collection the burst owes runs on the first allocation after gc.enable().
            self._gc_resume = asyncio.get_running_loop().call_soon(self._enable_gc)

    def _enable_gc(self) -> None:
        self._gc_resume = None
        if self._gc_paused:
            self._gc_paused = False
            gc.enable()

    def close(self) -> None:
        """Resume everything now (the engine is stopping)."""
        self._spent = False
        self._resume()
        if self._gc_resume is not None:
            self._gc_resume.cancel()
        self._enable_gc()

    def stats(self) -> dict[str, int]:
        """Counters for the engine's stats."""
        return {"holds": self.holds, "holds_expired": self.holds_expired}
