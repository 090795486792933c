"""The engine: one certificate, one codec registry, one UDP port, viewer sessions."""

from ruseon_appliance.engine.engine import Engine, StreamNotReady
from ruseon_appliance.engine.errors import (
    MalformedOffer,
    OfferError,
    OfferTooLarge,
    TooManyViewers,
    UnknownSession,
    UnsupportedOffer,
)
from ruseon_appliance.engine.session import WhepSession

__all__ = [
    "Engine",
    "MalformedOffer",
    "OfferError",
    "OfferTooLarge",
    "StreamNotReady",
    "TooManyViewers",
    "UnknownSession",
    "UnsupportedOffer",
    "WhepSession",
]
