"""The camera's RTP stream, as every protocol sends it: what WebRTC (``engine/``), RTSP
(``rtsp/``) and the relays (``relay/``) share.

- ``cursor.py``: a reader's place in the ring and its output timeline (joining, catching up);
- ``h264_rtp.py`` and ``history.py``: each frame packetized once, kept for retransmissions;
- ``fanout.py``: the send loop that wakes on each ring write and services every reader;
- the parts of one sent stream, each with one duty: ``rtp_header.py`` (the header made once),
  ``rtp_writer.py`` (the per-packet loop: SRTP in place, GSO batches), ``pacing.py`` (send
  budget, join-burst pace), ``nack.py`` (NACK responder), ``reports.py`` (sender reports,
  receiver-report statistics);
- ``rtcp.py``, ``srtp.py``, ``gso.py``: RTCP builders/parsers, libsrtp in place, UDP GSO.

Imports point one way: nothing here imports ``engine/``, ``rtsp/``, ``relay/``, ``web/`` or the
app (``tests/stream/test_layering.py``).
"""
