"""A camera's audio: source -> clock alignment -> gain/mute -> meter -> Opus and AAC rings."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..capture.access_unit import AccessUnit
from ..capture.ring import RingBuffer
from ..stream.aac import parse_aac_config
from .encoders import AAC_BITRATE, OPUS_BITRATE, AudioEncoder, aac_encoder, opus_encoder
from .format import AUDIO_CLOCK_RATE, CodedFrame, PcmChunk
from .sources.base import AudioSource, AudioSourceUnavailable

log = logging.getLogger(__name__)

# Each ring holds about 10 s of packets (Opus: 50 a second, AAC: 47).
RING_BYTES = 512 * 1024
RING_SLOTS = 512
# A device whose clock runs fast or slow against the capture clock is resampled: past
# RESAMPLE_FROM_US of smoothed drift each chunk is stretched or squeezed (linear
# interpolation) to take back the drift over RESAMPLE_HORIZON_S, by at most
# RESAMPLE_MAX_RATIO. The sound stays continuous (no gap, no jump): a crystal 100 ppm off is
# corrected by a rate change of 0.01 %, inaudible.
RESAMPLE_FROM_US = 2_000
RESAMPLE_HORIZON_S = 0.5
RESAMPLE_MAX_RATIO = 0.05
# What resampling cannot hold (a device several percent off, a stall shorter than a hole) is
# pulled back in one step past this (silence inserted when the device is slow, samples dropped
# when it is fast). Below one video frame at 25 fps, so lip sync stays within what a viewer
# can see.
DRIFT_LIMIT_US = 30_000
# The offset is averaged over about 20 chunks (400 ms): a read's jitter is not drift.
DRIFT_SMOOTHING = 0.05
# A hole longer than this (an unplug, a stalled machine) restarts the timeline instead.
GAP_RESET_US = 1_000_000
# A passed-through frame whose place by the sample clock is less than a frame from where the
# last one ended continues it exactly (pts + duration): that place wobbles (the chunks' lengths
# after resampling, and an IP camera's arrival times: 10.4 ms seen with the suite's load), the
# camera's frames do not. A frame or more late (a hole) it goes on whole frames later; a frame
# or more early it is dropped (it would overlap what went out); past PASSTHROUGH_STEP (a step of
# the timeline) it is placed anew. Its RTP timestamps step by whole frames, never by a part.
PASSTHROUGH_STEP = AUDIO_CLOCK_RATE  # 1 s
# Where a camera's own AAC configuration is remembered (in its state directory).
AAC_CONFIG_FILE = "aac-config"
# AudioSpecificConfigs kept for aac_config_for (a change is one camera (re)connection).
CONFIG_HISTORY = 8
# Waits between attempts to open a missing device.
RETRY_S = (1.0, 2.0, 5.0, 10.0)
SILENCE_DBFS = -90.0


def _usable_aac(config: bytes) -> bool:
    """AAC-LC of 1-2 channels: what is passed through (and remembered)."""
    try:
        info = parse_aac_config(config)
    except ValueError:
        return False
    return info.object_type == 2 and info.channels in (1, 2)


def _read_config(path: Path | None) -> bytes | None:
    """The remembered AudioSpecificConfig (hex), None when there is none or it is unusable."""
    if path is None:
        return None
    try:
        config = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return config if _usable_aac(config) else None


def _write_config(path: Path | None, config: bytes) -> None:
    """Remember ``config`` (a failure only costs the switch at the next start)."""
    if path is None or _read_config(path) == config:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(config.hex() + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not remember the camera's AAC configuration in %s: %s", path, exc)


def level_dbfs(samples: np.ndarray) -> float:
    """RMS level of int16 samples in dBFS (a full-scale sine is -3; silence is -90)."""
    if not len(samples):
        return SILENCE_DBFS
    rms = math.sqrt(float(np.mean(np.square(samples.astype(np.float64)))))
    return max(SILENCE_DBFS, 20 * math.log10(rms / 32768.0)) if rms > 0 else SILENCE_DBFS


class AudioPipeline:
    """One camera's audio, encoded once per codec into :attr:`opus_ring` and :attr:`aac_ring`.

    Ring entries are :class:`~ruseon_appliance.capture.access_unit.AccessUnit` s: one encoded
    packet each (Opus: 20 ms; AAC: 1024 samples), ``pts`` in 1/48000 s on a timeline that only
    grows (a re-opened device continues it, skipping the gap), ``capture_time_us`` on the
    video's wall clock, ``keyframe`` always True (any packet can start a stream). Written on
    the loop thread; the source and encoders run on one worker thread.

    **Passthrough.** A source that carries its own packets (an IP camera's AAC or Opus track,
    :class:`~.format.CodedFrame`) has them written to the ring of the same codec unchanged, and
    only the other codec is encoded; while muted or with a gain, both are encoded (from the
    decoded PCM, as for any source). The camera's AAC may be any rate and 1-2 channels: the AAC
    ring then holds frames of the camera's AudioSpecificConfig (the encode that stands in for
    them while muted matches its rate and channels), and :attr:`aac_config` changes to it when
    the camera first sends. A consumer that wrote the old one into an init segment or an SDP
    finds which configuration a frame has by :meth:`aac_config_for` its ring seq (HLS and
    recordings start a new init segment at the next IDR; an RTSP session drops frames of
    another configuration than its SDP's).
    """

    def __init__(self, source: AudioSource, *, gain_db: float = 0.0, muted: bool = False,
                 opus_bitrate: int = OPUS_BITRATE, aac_bitrate: int = AAC_BITRATE,
                 retry_s: tuple[float, ...] = RETRY_S,
                 aac_config_file: Path | None = None) -> None:
        self.source = source
        self.opus_ring = RingBuffer(RING_BYTES, RING_SLOTS)
        self.aac_ring = RingBuffer(RING_BYTES, RING_SLOTS)
        self._opus_bitrate = opus_bitrate
        self._aac_bitrate = aac_bitrate
        # The AAC encoder is made now: its AudioSpecificConfig goes into HLS and recording
        # init segments before the first packet.
        self._aac: AudioEncoder = aac_encoder(aac_bitrate)
        self._opus: AudioEncoder = opus_encoder(opus_bitrate)
        # (first AAC ring seq, AudioSpecificConfig) of each configuration, oldest first.
        self._default_aac_config = self._aac.extradata
        self._aac_configs: list[tuple[int, bytes]] = [(0, self._default_aac_config)]
        # The rate and channels the AAC encode is made for (the camera's, when it has AAC).
        self._aac_format = (AUDIO_CLOCK_RATE, 1)
        self._camera_aac: bytes | None = None  # the camera's own AudioSpecificConfig
        self._camera_aac_usable = False
        # The camera's configuration from the last run (``aac_config_file``): the AAC ring
        # starts with it, so HLS and recordings do not switch to it at the camera's first sound.
        self._aac_config_file = aac_config_file
        remembered = _read_config(aac_config_file)
        if remembered is not None:
            info = parse_aac_config(remembered)
            self._aac_configs = [(0, remembered)]
            self._aac_format = (info.sample_rate, info.channels)
            self._aac = aac_encoder(aac_bitrate, *self._aac_format)
        self._config_change: bytes | None = None  # for the next write on the loop
        # Where the next passed-through packet of each codec starts (pts), when it continues.
        self._coded_next: dict[str, int | None] = {"opus": None, "aac": None}
        self._passthrough = {"opus": [0, 0], "aac": [0, 0]}  # packets, bytes
        self.passthrough_dropped = {"opus": 0, "aac": 0}
        self._passing = {"opus": False, "aac": False}
        # A codec nobody reads (no reader on its ring: no WebRTC viewer or RTSP client for
        # Opus, no HLS or recording for AAC) is not encoded; the first reader gets a fresh
        # encoder from the next chunk on. Counts of the encoders retired so far:
        self._encoding = {"opus": True, "aac": True}
        self._retired = {"opus": [0, 0], "aac": [0, 0]}  # packets, bytes
        self._retry_s = retry_s
        self._gain_db = gain_db
        self._muted = muted
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # The sample clock: the next sample's pts, and the capture time it maps to.
        self._next_pts = 0
        self._next_capture_us: int | None = None
        self._drift_avg_us = 0.0
        self.level_dbfs = SILENCE_DBFS
        self.peak_dbfs = SILENCE_DBFS
        self.running = False
        self.last_error: str | None = None
        self.chunks_in = 0
        self.samples_in = 0
        self.silence_inserted = 0
        self.samples_dropped = 0
        self.drift_corrections = 0
        # Chunks resampled to follow the capture clock, and the samples that added (net).
        self.chunks_resampled = 0
        self.samples_resampled = 0
        self.timeline_resets = 0
        self.source_failures = 0
        self.chunks_bad = 0
        self.last_packet_monotonic: float | None = None

    # -- control (any thread; applied to the next chunk) ---------------------------------------
    @property
    def kind(self) -> str:
        """The source's kind ("tone", "alsa", "rtsp")."""
        return str(getattr(self.source, "kind", "unknown"))

    @property
    def muted(self) -> bool:
        """Muted: silence is sent (timing and sync carry on)."""
        return self._muted

    def set_muted(self, muted: bool) -> None:
        """Mute or unmute."""
        self._muted = bool(muted)

    @property
    def gain_db(self) -> float:
        """Gain applied before the encoders, in dB."""
        return self._gain_db

    def set_gain_db(self, gain_db: float) -> None:
        """Set the gain (dB; -60..+30)."""
        if not -60.0 <= gain_db <= 30.0 or math.isnan(gain_db):
            raise ValueError("gain must be -60 to 30 dB")
        self._gain_db = float(gain_db)

    @property
    def aac_config(self) -> bytes:
        """AAC's AudioSpecificConfig (for an ``esds`` box or an SDP ``config=``): of the frames
        written from now on."""
        return self._aac_configs[-1][1]

    def aac_config_for(self, seq: int) -> bytes:
        """The AudioSpecificConfig of AAC ring frame ``seq``."""
        for first, config in reversed(self._aac_configs):
            if seq >= first:
                return config
        return self._aac_configs[0][1]

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the worker thread (opening the source there: a missing device is retried)."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="audio", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop the worker thread and release the source."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        self.source.close()
        await asyncio.to_thread(thread.join)
        self.running = False

    def problem(self) -> str | None:
        """Why there is no sound now, or None."""
        return self.last_error if not self.running else None

    # -- the worker thread ------------------------------------------------------------------------
    def _run(self) -> None:
        attempt = 0
        while not self._stopping.is_set():
            try:
                self.source.open()
            except AudioSourceUnavailable as exc:
                self._failed(str(exc), attempt)
                attempt += 1
                continue
            except Exception as exc:  # a broken backend: reported and retried like a missing one
                log.exception("audio source %s failed to open", self.kind)
                self._failed(f"{type(exc).__name__}: {exc}", attempt)
                attempt += 1
                continue
            if self.last_error is not None:
                log.info("audio source %s is back", self.kind)
            self.last_error = None
            self.running = True
            attempt = 0
            try:
                while not self._stopping.is_set():
                    chunk = self.source.read()
                    if chunk is None:
                        break
                    self._take(chunk)
            except AudioSourceUnavailable as exc:
                self.running = False
                self.source.close()
                self._failed(str(exc), 0)
                continue
            except Exception as exc:
                self.running = False
                self.source.close()
                log.exception("audio source %s failed", self.kind)
                self._failed(f"{type(exc).__name__}: {exc}", 0)
                continue
            self.running = False
            if not self._stopping.is_set():  # the source ended by itself: open it again
                self.source.close()
                self._failed("the audio source ended", 0)

    def _failed(self, reason: str, attempt: int) -> None:
        if reason != self.last_error:
            log.warning("audio source %s: %s (retrying; video is not affected)",
                        self.kind, reason)
        self.last_error = reason
        self.source_failures += 1
        self._stopping.wait(self._retry_s[min(attempt, len(self._retry_s) - 1)])

    def _take(self, chunk: PcmChunk) -> None:
        samples = np.asarray(chunk.samples)
        if samples.dtype != np.int16 or samples.ndim != 1:
            self.chunks_bad += 1  # a broken chunk is skipped, never fatal
            return
        self.chunks_in += 1
        self.samples_in += len(samples)
        samples = self._align(samples, chunk.capture_time_us)
        if not len(samples):
            return
        if self._muted:
            samples = np.zeros_like(samples)
        elif self._gain_db:
            scaled = samples.astype(np.float32) * (10.0 ** (self._gain_db / 20.0))
            samples = np.clip(scaled, -32768, 32767).astype(np.int16)
        level = level_dbfs(samples)
        self.level_dbfs = level
        self.peak_dbfs = max(level, self.peak_dbfs - 1.0)  # falls 1 dB a chunk (50 dB/s)
        pts = self._next_pts
        capture0 = self._next_capture_us
        assert capture0 is not None
        self._next_pts += len(samples)
        self._next_capture_us = capture0 + len(samples) * 1_000_000 // AUDIO_CLOCK_RATE
        plain = not self._muted and not self._gain_db
        coded = {"opus": [c for c in chunk.coded if c.codec == "opus"],
                 "aac": [c for c in chunk.coded if c.codec == "aac"]}
        if coded["aac"]:
            self._camera_config(coded["aac"][0].config)
        pairs: dict[str, list[tuple[bytes, int]]] = {}
        for codec in ("opus", "aac"):
            passing = plain and bool(coded[codec]) and (
                codec == "opus" or self._camera_aac_usable)
            if passing:
                pairs[codec] = self._pass(codec, coded[codec], pts)
            else:
                if self._passing[codec]:
                    self._passing[codec] = False
                    self._coded_next[codec] = None
                pairs[codec] = self._encode(codec, samples, pts)
        opus, aac = pairs["opus"], pairs["aac"]
        if not opus and not aac:
            return
        units = [(self.opus_ring, self._unit(data, p, pts, capture0)) for data, p in opus]
        units += [(self.aac_ring, self._unit(data, p, pts, capture0)) for data, p in aac]
        change, self._config_change = self._config_change, None
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._write, units, change)
        except RuntimeError:  # the loop is closed
            self._stopping.set()

    def _camera_config(self, config: bytes) -> None:
        """The camera's AAC is ``config``: its frames go to the AAC ring as they are when it can
        be muxed (AAC-LC, 1-2 channels), and the encode that stands in for them (muted, a gain)
        is made for its rate and channels, so the ring keeps one configuration."""
        if config == self._camera_aac:
            return
        self._camera_aac = config
        usable = self._camera_aac_usable = _usable_aac(config)
        if not usable:
            log.warning("the camera's AAC (AudioSpecificConfig %s) is not passed through (AAC-LC "
                        "of 1-2 channels only): encoded from its sound instead", config.hex())
            wanted, fmt = self._default_aac_config, (AUDIO_CLOCK_RATE, 1)
        else:
            info = parse_aac_config(config)
            log.info("the camera's AAC (%d Hz, %d channel(s)) is passed through to HLS, "
                     "recordings and RTSP", info.sample_rate, info.channels)
            wanted, fmt = config, (info.sample_rate, info.channels)
            _write_config(self._aac_config_file, config)
        if fmt != self._aac_format:
            self._aac_format = fmt
            self._retire("aac")  # the next encode is made for the new format
        if wanted != self.aac_config and wanted != self._config_change:
            self._config_change = wanted

    def _pass(self, codec: str, frames: list[CodedFrame], pts: int) -> list[tuple[bytes, int]]:
        """The camera's own ``frames`` of ``codec``, placed at ``pts`` (their chunk's)."""
        if not self._passing[codec]:
            self._passing[codec] = True
            self._retire(codec)  # encoding again later starts a fresh encoder
        out = []
        counts = self._passthrough[codec]
        for frame in frames:
            at = pts + frame.offset
            expected = self._coded_next[codec]
            late = 0 if expected is None else at - expected
            if expected is not None and frame.duration > 0 and abs(late) < PASSTHROUGH_STEP:
                if late <= -frame.duration:
                    self.passthrough_dropped[codec] += 1
                    continue
                at = expected + max(0, late // frame.duration) * frame.duration
            self._coded_next[codec] = at + frame.duration
            out.append((frame.data, at))
            counts[0] += 1
            counts[1] += len(frame.data)
        return out

    def _retire(self, codec: str) -> None:
        """Stop ``codec``'s encoder (its counts are kept); the next encode makes a fresh one."""
        if self._encoding[codec]:
            self._encoding[codec] = False
            encoder = self._opus if codec == "opus" else self._aac
            retired = self._retired[codec]
            retired[0] += encoder.packets
            retired[1] += encoder.bytes

    def _encode(self, codec: str, samples: Any, pts: int) -> list[tuple[bytes, int]]:
        """``samples`` (at ``pts``) through ``codec``'s encoder while its ring has readers."""
        ring = self.opus_ring if codec == "opus" else self.aac_ring
        encoder = self._opus if codec == "opus" else self._aac
        if not ring.reader_count:
            self._retire(codec)  # the last reader left
            return []
        if not self._encoding[codec]:  # a reader again: a fresh encoder from this chunk
            self._encoding[codec] = True
            if codec == "opus":
                encoder = self._opus = opus_encoder(self._opus_bitrate)
            else:
                encoder = self._aac = aac_encoder(self._aac_bitrate, *self._aac_format)
        return encoder.encode(samples, pts)

    def _codec_stats(self, codec: str) -> dict[str, Any]:
        encoder = self._opus if codec == "opus" else self._aac
        packets, size = self._retired[codec]
        if self._encoding[codec]:
            packets, size = packets + encoder.packets, size + encoder.bytes
        passed = self._passthrough[codec]
        return {"codec": encoder.codec,
                "bitrate": self._opus_bitrate if codec == "opus" else self._aac_bitrate,
                "encoding": self._encoding[codec], "packets": packets, "bytes": size,
                "passthrough": self._passing[codec], "passthrough_packets": passed[0],
                "passthrough_bytes": passed[1],
                "passthrough_dropped": self.passthrough_dropped[codec]}

    @staticmethod
    def _unit(data: bytes, pts: int, chunk_pts: int, chunk_capture_us: int) -> AccessUnit:
        capture = chunk_capture_us + (pts - chunk_pts) * 1_000_000 // AUDIO_CLOCK_RATE
        return AccessUnit(data, pts, True, capture)

    def _write(self, units: list[tuple[RingBuffer, AccessUnit]],
               config: bytes | None = None) -> None:
        if config is not None:  # the AAC frames from here on have this configuration
            self._aac_configs.append((self.aac_ring.newest_seq + 1, config))
            del self._aac_configs[:-CONFIG_HISTORY]
        for ring, unit in units:
            ring.write(unit)
        self.last_packet_monotonic = time.monotonic()

    def _align(self, samples: Any, capture_us: int) -> Any:
        """Keep the sample clock on the capture clock: a device that runs slow or fast is
        resampled (:data:`RESAMPLE_FROM_US`); what that cannot hold is stepped back past
        :data:`DRIFT_LIMIT_US`; a hole restarts the timeline past it."""
        expected = self._next_capture_us
        if expected is None:
            self._next_capture_us = capture_us
            return samples
        offset = capture_us - expected  # > 0: the device delivered fewer samples than time passed
        if abs(offset) > GAP_RESET_US:
            # An unplug or a stall: the timeline jumps over the hole (pts keeps growing).
            self.timeline_resets += 1
            if offset > 0:
                self._next_pts += offset * AUDIO_CLOCK_RATE // 1_000_000
            self._next_capture_us = capture_us
            self._drift_avg_us = 0.0
            self._opus.restart_at(self._next_pts)
            self._aac.restart_at(self._next_pts)
            return samples
        self._drift_avg_us += DRIFT_SMOOTHING * (offset - self._drift_avg_us)
        if abs(self._drift_avg_us) <= DRIFT_LIMIT_US:
            if abs(self._drift_avg_us) > RESAMPLE_FROM_US and len(samples) > 1:
                return self._resample(samples)
            return samples
        self.drift_corrections += 1
        correction = int(self._drift_avg_us * AUDIO_CLOCK_RATE // 1_000_000)
        self._drift_avg_us = 0.0
        if correction > 0:
            self.silence_inserted += correction
            return np.concatenate([np.zeros(correction, dtype=np.int16), samples])
        drop = min(-correction, len(samples))
        self.samples_dropped += drop
        return samples[drop:]

    def _resample(self, samples: Any) -> Any:
        """``samples`` stretched (the device is slow: the sample clock lags) or squeezed (it
        is fast) so the drift goes back over :data:`RESAMPLE_HORIZON_S`."""
        n = len(samples)
        chunk_s = n / AUDIO_CLOCK_RATE
        wanted = self._drift_avg_us / 1e6 * AUDIO_CLOCK_RATE * chunk_s / RESAMPLE_HORIZON_S
        limit = n * RESAMPLE_MAX_RATIO
        change = round(max(-limit, min(limit, wanted)))
        if not change:
            return samples
        out_n = n + change
        positions = np.linspace(0.0, n - 1, out_n)
        out = np.interp(positions, np.arange(n), samples.astype(np.float32))
        self.chunks_resampled += 1
        self.samples_resampled += change
        # What this takes back, taken out of the average now (the next offsets show it).
        self._drift_avg_us -= change * 1e6 / AUDIO_CLOCK_RATE
        return np.round(out).astype(np.int16)

    def stats(self) -> dict[str, Any]:
        """For /api/status and /metrics."""
        return {
            "enabled": True,
            "source": self.kind,
            "running": self.running,
            "problem": self.problem(),
            "muted": self._muted,
            "gain_db": self._gain_db,
            "level_dbfs": round(self.level_dbfs, 1),
            "peak_dbfs": round(self.peak_dbfs, 1),
            "chunks_in": self.chunks_in,
            "chunks_bad": self.chunks_bad,
            "samples_in": self.samples_in,
            "silence_inserted": self.silence_inserted,
            "samples_dropped": self.samples_dropped,
            "drift_corrections": self.drift_corrections,
            "chunks_resampled": self.chunks_resampled,
            "samples_resampled": self.samples_resampled,
            "timeline_resets": self.timeline_resets,
            "source_failures": self.source_failures,
            "opus": self._codec_stats("opus"),
            "aac": self._codec_stats("aac"),
            "source_stats": self.source.stats(),
        }
