"""Audio: a camera's sound, captured once, encoded once per codec, read by every output.

A camera's :class:`~ruseon_appliance.audio.pipeline.AudioPipeline` pulls PCM from its
:mod:`source <ruseon_appliance.audio.sources>` (the synthetic camera's test tone, an ALSA
device, an IP camera's own track) on a worker thread, applies gain and mute, meters the level,
keeps the sample clock aligned with the capture clock, and writes Opus packets (WebRTC, RTSP,
the relay) and AAC frames (HLS, recordings) into two fixed rings, the same
:class:`~ruseon_appliance.capture.ring.RingBuffer` the video uses. Outputs read those rings as
they read the video's; the capture timestamps of both are on the same wall clock, which is what
keeps sound and picture in sync.

(Import :mod:`.pipeline` and :mod:`.sources` by name: this package's own import is cheap, for
the cameras without sound.)
"""
