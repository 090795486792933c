"""HLS and Low-Latency HLS from the shared fMP4 segmenter: an in-memory live window of parts and
segments, the media playlist, and the waits blocking playlist reloads hold on.

Knows nothing of HTTP: ``web/hls.py`` serves it. Reads the capture ring like any viewer.
"""

from ruseon_appliance.hls.playlist import render
from ruseon_appliance.hls.stream import HlsStream, TooManyWaiting
from ruseon_appliance.hls.window import LiveWindow, Part, Segment

__all__ = ["HlsStream", "LiveWindow", "Part", "Segment", "TooManyWaiting", "render"]
