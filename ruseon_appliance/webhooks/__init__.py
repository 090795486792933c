"""Webhooks: appliance events as signed JSON POSTs, one bounded queue per ``[[webhook]]``."""

from .sender import SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookSender, sign

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "WebhookSender", "sign"]
