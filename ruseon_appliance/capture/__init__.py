"""Capture: camera sources, H.264 bitstream handling, the SPS/PPS muxer and the ring buffer."""
