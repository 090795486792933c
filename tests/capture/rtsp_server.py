"""A real RTSP server for the RTSP source's tests: GStreamer's gst-rtsp-server (Debian's
gir1.2-gst-rtsp-server-1.0), serving a recorded Annex B ``.h264`` file at its own pace.

Run by Debian's ``/usr/bin/python3`` (the test venv may not see python3-gi):
``/usr/bin/python3 rtsp_server.py PORT PATH FILE [AUDIO]``; prints ``ready`` once it listens, on
127.0.0.1 only. ``AUDIO`` (default none) adds a sound track as an IP camera's: ``aac`` (AAC-LC
16 kHz mono, RFC 3640), ``pcmu`` (G.711 mu-law 8 kHz) or ``opus`` (48 kHz), each a 440 Hz
sine at half scale from GStreamer's audiotestsrc. FILE is MPEG-TS (``.ts``: each access unit
stamped, so its RTP timestamps advance as a camera's do and it is sent in real time) or a bare
Annex B ``.h264`` (sent in real time too, but every frame with the same RTP timestamp: h264parse
makes none). The RTP payloader repeats SPS/PPS in-band before every IDR.
"""

from __future__ import annotations

import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

AUDIO = {
    "none": "",
    "aac": "audio/x-raw,rate=16000,channels=1 ! avenc_aac ! rtpmp4gpay name=pay1 pt=97",
    "pcmu": "audio/x-raw,rate=8000,channels=1 ! mulawenc ! rtppcmupay name=pay1 pt=0",
    "opus": "audio/x-raw,rate=48000,channels=1 ! opusenc ! rtpopuspay name=pay1 pt=98",
}


def main() -> int:
    port, path, filename = sys.argv[1], sys.argv[2], sys.argv[3]
    audio = AUDIO[sys.argv[4] if len(sys.argv) > 4 else "none"]
    if audio:
        audio = (" audiotestsrc is-live=true wave=sine freq=440 volume=0.5 ! audioconvert ! "
                 "audioresample ! " + audio)
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(port)
    factory = GstRtspServer.RTSPMediaFactory()
    demux = "tsdemux ! " if filename.endswith(".ts") else ""
    factory.set_launch(f'( filesrc location="{filename}" ! {demux}h264parse ! '
                       "video/x-h264,stream-format=byte-stream,alignment=au ! "
                       f"rtph264pay name=pay0 pt=96 config-interval=-1{audio} )")
    factory.set_shared(True)
    server.get_mount_points().add_factory(path, factory)
    if server.attach(None) == 0:
        print("cannot listen", flush=True)
        return 1
    print("ready", flush=True)
    GLib.MainLoop().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
