"""Answers from a per-offer-shape template: the text aiortc would write, without aiortc.

Every offer from the same browser (and page) has the same *shape*: the same media sections,
codecs, header extensions, mids, directions, setup role and BUNDLE group; only its ICE
credentials, DTLS fingerprint, origin line, ports and addresses, SSRCs and stream ids differ.
aiortc's answer to an offer depends on the shape alone (and on the stream's profile and whether
the engine has sound for it); what differs from one answer to the next is the engine's own
per-session values: the ICE ufrag and password, each sender's SSRCs, the stream and track ids
(``a=msid``), the CNAME, and the origin line.

So: the first offer of a shape is answered by aiortc (the eager path), and its answer becomes
an :class:`AnswerTemplate` with those values as fields; later offers of the shape are answered
by filling the fields with fresh values (:class:`Identities`), and when the viewer's first
valid STUN check arrives the engine builds the aiortc objects with exactly those values and
checks that aiortc's own answer is the one that was sent (:func:`same_answer`).
"""

from __future__ import annotations

import re
import secrets
import struct
import time
import uuid
from dataclasses import dataclass

# Offer lines whose values are the offerer's own per-offer state: left out of the shape (the
# offer as a whole is still parsed and checked by aiortc's parser, offer.check_offer).
_PER_OFFER_PREFIXES = ("o=", "c=", "a=ice-ufrag:", "a=ice-pwd:", "a=fingerprint:",
                       "a=ssrc:", "a=ssrc-group:", "a=msid:", "a=rtcp:")
# Answer lines carrying the engine's per-session values (every other line is the same for
# every answer of a shape).
_CANDIDATE_PREFIXES = ("a=candidate:", "a=end-of-candidates")
_PER_OFFER_PREFIXES_AND_CANDIDATES = _PER_OFFER_PREFIXES + _CANDIDATE_PREFIXES
_PER_SESSION_PREFIXES = ("a=ice-ufrag:", "a=ice-pwd:", "a=msid:", "a=ssrc:", "a=ssrc-group:")
_TOKENS = re.compile(r"([ :])")
# Seconds from 1900 (NTP) to 1970 (Unix): aiortc's origin line is NTP seconds.
_NTP_OFFSET = 2208988800


def offer_shape(sdp: str) -> str:
    """``sdp`` (an offer, candidates already stripped) without the offerer's per-offer values:
    two offers of the same shape get the same answer from aiortc, but for the engine's own
    per-session values."""
    return _shape_of(sdp.splitlines())


def _shape_of(lines: list[str]) -> str:
    out: list[str] = []
    for line in lines:
        if line.startswith(_PER_OFFER_PREFIXES):
            out.append(line.partition(":")[0] if line.startswith("a=") else line[:2])
        elif line.startswith("m="):
            kind, _, rest = line.partition(" ")
            out.append(kind + " " + rest.partition(" ")[2])
        else:
            out.append(line)
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class QuickOffer:
    """An offer's text as ``offer.check_offer`` keeps it (candidates stripped) and its shape."""

    sdp: str
    shape: str


_CONNECTION = re.compile(r"IN (IP4|IP6) [^ ]+")


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _plain_value(line: str) -> bool:
    """Whether a per-offer line's value is one aiortc's parser takes and ``check_offer``
    accepts (stricter where in doubt: a doubtful offer is checked in full)."""
    if line.startswith("o="):
        return True
    if line.startswith("c="):
        return _CONNECTION.fullmatch(line[2:]) is not None
    value = line.partition(":")[2]
    if line.startswith(("a=ice-ufrag:", "a=ice-pwd:")):
        return bool(value) and value == value.strip()
    if line.startswith("a=fingerprint:"):
        return len(value.split()) == 2
    if line.startswith("a=msid:"):
        return True
    if line.startswith("a=ssrc:"):
        ssrc, _, description = value.partition(" ")
        return _digits(ssrc) and ":" in description
    if line.startswith("a=ssrc-group:"):
        bits = value.split()
        return bool(bits) and all(_digits(b) for b in bits[1:])
    if line.startswith("a=rtcp:"):
        port, space, host = value.partition(" ")
        return _digits(port) and (not space or _CONNECTION.fullmatch(host) is not None)
    return False


def quick_offer(sdp: str, max_bytes: int) -> QuickOffer | None:
    """One pass over an offer: its stripped text and shape, when everything in it that is not
    part of its shape is plainly valid; None when it is not (then ``check_offer`` decides, and
    says why). An offer whose shape is that of an offer ``check_offer`` accepted, and whose
    per-offer values are plainly valid, is accepted by ``check_offer`` too: the rest of its
    lines are the same, and ``check_offer`` reads only whether those values are there."""
    if len(sdp) > max_bytes or len(sdp.encode("utf-8", errors="replace")) > max_bytes:
        return None
    kept: list[str] = []
    shape: list[str] = []
    for line in sdp.strip().splitlines():
        if line.startswith(_PER_OFFER_PREFIXES_AND_CANDIDATES):
            if line.startswith(_CANDIDATE_PREFIXES):
                continue
            if not _plain_value(line):
                return None
            shape.append(line.partition(":")[0] if line.startswith("a=") else line[:2])
        elif line.startswith("m="):
            kind, _, rest = line.partition(" ")
            port, _, tail = rest.partition(" ")
            if not _digits(port):
                return None
            shape.append(kind + " " + tail)
        else:
            shape.append(line)
        kept.append(line)
    return QuickOffer("\r\n".join(kept) + "\r\n", "\n".join(shape))


@dataclass(frozen=True, slots=True)
class SenderIdentity:
    """What an answer says of one RTP sender: its SSRC, RTX SSRC and track id."""

    ssrc: int
    rtx_ssrc: int
    track_id: str


@dataclass(frozen=True, slots=True)
class Identities:
    """A session's values in its answer, beside its ICE credentials: the CNAME, the stream id
    its senders share (``a=msid``, as in aiortc) and each sender's identity, in the peer
    connection's transceiver order."""

    cname: str
    stream_id: str
    senders: tuple[SenderIdentity, ...]

    @classmethod
    def fresh(cls, senders: int) -> Identities:
        """New random values for ``senders`` senders."""
        words = struct.unpack(f"!{2 * senders}I", secrets.token_bytes(8 * senders))
        return cls(str(uuid.uuid4()), str(uuid.uuid4()), tuple(
            SenderIdentity(words[2 * i], words[2 * i + 1], str(uuid.uuid4()))
            for i in range(senders)))

    def values(self) -> dict[str, str]:
        """Field name -> value, as the answer spells them."""
        values = {"cname": self.cname, "stream": self.stream_id}
        for i, sender in enumerate(self.senders):
            values[f"s{i}_ssrc"] = str(sender.ssrc)
            values[f"s{i}_rtx"] = str(sender.rtx_ssrc)
            values[f"s{i}_track"] = sender.track_id
        return values


def origin_line() -> str:
    """An origin line as aiortc writes it (NTP seconds now, as session id and version)."""
    seconds = int(time.time()) + _NTP_OFFSET
    return f"o=- {seconds} {seconds} IN IP4 0.0.0.0"


class AnswerTemplate:
    """An answer with the per-session values as fields (see the module's docstring)."""

    def __init__(self, text: str, senders: int) -> None:
        self._text = text
        self.senders = senders
        self.uses = 0

    @classmethod
    def learn(cls, answer: str, ufrag: str, password: str,
              identities: Identities) -> AnswerTemplate | None:
        """The template of ``answer`` (aiortc's, to an offer of some shape), made with these
        values; None when a value cannot be told apart (appears where no field may be, or two
        values are equal), so this shape stays on the eager path."""
        fields = {"ufrag": ufrag, "pwd": password, **identities.values()}
        by_value = {value: name for name, value in fields.items()}
        if len(by_value) != len(fields):
            return None
        lines: list[str] = []
        origins = 0
        for line in answer.split("\r\n"):
            if line.startswith("o="):
                lines.append("{origin}")
                origins += 1
                continue
            escaped_tokens: list[str] = []
            per_session = line.startswith(_PER_SESSION_PREFIXES)
            for token in _TOKENS.split(line):
                name = by_value.get(token)
                if name is not None and per_session:
                    escaped_tokens.append("{" + name + "}")
                elif name is not None or any(v in token for v in by_value if len(v) >= 8):
                    return None  # one of our values outside the lines that carry them
                else:
                    escaped_tokens.append(token.replace("{", "{{").replace("}", "}}"))
            lines.append("".join(escaped_tokens))
        if origins != 1:
            return None
        text = "\r\n".join(lines)
        template = cls(text, len(identities.senders))
        # What it renders with the same values must be the answer it was learned from.
        if not same_answer(template.render(ufrag, password, identities, "o=-"), answer):
            return None
        return template

    def render(self, ufrag: str, password: str, identities: Identities,
               origin: str | None = None) -> str:
        """The answer for a session with these values."""
        if len(identities.senders) != self.senders:
            raise ValueError("identities for another number of senders")
        self.uses += 1
        return self._text.format_map({"ufrag": ufrag, "pwd": password,
                                      "origin": origin or origin_line(),
                                      **identities.values()})


def same_answer(a: str, b: str) -> bool:
    """Whether two answers are the same but for their origin line (which aiortc never reads
    back and the offerer only compares with later answers of the same session)."""
    def cut(text: str) -> list[str]:
        return [line for line in text.split("\r\n") if not line.startswith("o=")]

    return cut(a) == cut(b)
