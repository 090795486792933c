"""Why an offer or a session request was refused, as types the web layer maps to HTTP statuses.

Every error carries ``reason``: one human-readable sentence a browser developer can act on.
"""

from __future__ import annotations


class OfferError(Exception):
    """Base class: the engine refused a request; ``reason`` says why in one sentence."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MalformedOffer(OfferError):
    """The body is not an SDP offer the engine can parse (web: 400)."""


class UnsupportedOffer(OfferError):
    """A valid offer the engine cannot serve: no usable H.264, wrong direction (web: 406/422)."""


class TooManyViewers(OfferError):
    """The viewer limit is reached (web: 503 with ``Retry-After``)."""

    def __init__(self, reason: str, retry_after: int = 5) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class TooManyFromAddress(TooManyViewers):
    """The offer's source address already holds its share of the viewer places, connected and
    pending together (``webrtc.max_viewers_per_address``; web: 429 with ``Retry-After``)."""


class OfferTooLarge(OfferError):
    """The offer exceeds the configured maximum size (web: 413)."""


class UnknownSession(OfferError):
    """No live session has that id (web: 404)."""
