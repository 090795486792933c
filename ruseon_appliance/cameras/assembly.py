"""Every configured camera with all its parts, built the same way (app.py's one call)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from ..capture.controls import CameraControls
from ..capture.sources.picamera import PicameraSource
from ..clock import WallClock
from ..config import CameraConfig, Config
from ..events import EventBus, RecordingWatcher, StallWatcher
from ..hls import HlsStream
from ..motion.store import EventStore
from ..motion.zones import Zone
from ..recording import Recorder, RecorderSettings
from .camera import Camera, CameraSet
from .layout import camera_dir

if TYPE_CHECKING:
    from ..motion.detector import MotionSettings


def assemble_cameras(config: Config, *, clock: WallClock, events: EventBus) -> CameraSet:
    """One :class:`Camera` per configured camera, each with its controls (saved under
    ``<state>/cameras/<name>/``), recorder (``<recording.dir>/cameras/<name>/``, its share of
    ``recording.max_bytes``), HLS stream (``[hls] enable``) and watchers; the default camera
    is ``http.default_camera`` (else the first listed). A camera with ``motion`` (the
    default) gets its detector, its events kept in ``<recording.dir>/cameras/<name>/events/``
    and its settings changed at run time in ``<state>/cameras/<name>/motion.json``."""
    configs = config.cameras
    rec = config.recording
    # recording.max_bytes bounds the whole recording disk: each camera keeps its share.
    share = rec.max_bytes // len(configs) if rec.max_bytes > 0 else 0
    archive = rec.directory(config.state.dir)
    state = Path(config.state.dir)
    cameras = []
    for cam_config in configs:
        camera = Camera(cam_config)
        camera.add_substream()  # capture/substream.py: where the source encodes one
        _equip(camera, cam_config, config, archive=camera_dir(archive, camera.name),
               state=camera_dir(state, camera.name), share=share, clock=clock, events=events)
        cameras.append(camera)
    return CameraSet(cameras, default=config.http.default_camera)


def _equip(camera: Camera, cam: CameraConfig, config: Config, *, archive: Path, state: Path,
           share: int, clock: WallClock, events: EventBus) -> None:
    pipeline = camera.pipeline
    rec = config.recording
    # First: its sound goes into the recordings and HLS (a second track, in sync by capture time).
    _equip_audio(camera, cam, state)
    audio = camera.audio
    camera.controls = CameraControls(pipeline.source, cam, state)
    recorder = camera.recorder = Recorder(RecorderSettings(
        directory=archive, continuous=rec.records_continuously, segment_s=rec.segment_s,
        preroll_s=rec.preroll_s, max_bytes=share, max_age_s=rec.max_age_hours * 3600,
        event_max_age_s=rec.event_max_age_hours * 3600 if cam.motion else 0.0,
        sync_interval_s=rec.sync_interval_s),
        pipeline.ring, clock=clock, audio=audio)
    if config.hls.enable:
        camera.hls = HlsStream(
            pipeline.ring, framerate=cam.framerate, keyframe_interval=cam.keyframe_interval,
            part_target_s=config.hls.part_duration_s, window_s=config.hls.window_s,
            max_waiting=config.hls.max_waiting_requests, audio=audio)
        if camera.sub is not None:
            # The sub-stream's own rendition, on its own ring (the multivariant playlist lists
            # both); parts and window as the main one's so players switch between them.
            sub = camera.sub.camera
            camera.sub_hls = HlsStream(
                camera.sub.ring, framerate=sub.framerate,
                keyframe_interval=sub.keyframe_interval,
                part_target_s=config.hls.part_duration_s, window_s=config.hls.window_s,
                max_waiting=config.hls.max_waiting_requests, audio=audio)
    camera.stall_watcher = StallWatcher(
        events, lambda: pipeline.last_frame_monotonic, framerate=cam.framerate,
        source=pipeline.source_kind, camera=camera.name)
    camera.recording_watcher = RecordingWatcher(
        events, lambda: recorder.active, lambda: recorder.state, camera=camera.name)
    if cam.motion:
        # Imported only for a camera that detects motion: numpy is ~20 MiB of RSS that a board
        # whose cameras all have motion = false never pays (tests/capture/test_lazy_imports.py).
        from ..motion.monitor import MotionMonitor
        from ..motion.recording import MotionRecording
        from ..motion.saved import MOTION_FILE, MotionFile

        # picamera2's lores stream where the source has one (no decode), else the H.264 of
        # the sub-stream's ring where the camera has one (640x360 decodes several times
        # cheaper than 720p; zones are picture fractions), else the main ring's.
        source = pipeline.source
        lores = source if isinstance(source, PicameraSource) and source.offers_lores else None
        decode_sub = lores is None and camera.sub is not None
        ring = camera.sub.ring if decode_sub and camera.sub is not None else pipeline.ring
        store = EventStore(archive / "events", camera.name,
                           max_age_s=max(rec.max_age_hours, rec.event_max_age_hours) * 3600,
                           trusted=lambda: clock.synchronized)
        camera.motion = MotionMonitor(
            ring, motion_settings(cam), camera=camera.name, publish=events.publish,
            stream="sub" if decode_sub else "main", store=store, lores=lores,
            saved=MotionFile(state / MOTION_FILE),  # the page's tuner and zones, kept
            announce_at_once=False)  # Camera.start_watching: once the bus has subscribers
        # The footage of an event: what a motion recording holds of it (the pre- and post-roll).
        recorder.event_windows = functools.partial(
            store.windows, before_s=rec.preroll_s, after_s=rec.postroll_s)
        if rec.mode == "motion":
            camera.motion_recording = MotionRecording(
                recorder, camera=camera.name, preroll_s=rec.preroll_s, postroll_s=rec.postroll_s)
            events.subscribe(camera.motion_recording.on_event)


def _equip_audio(camera: Camera, cam: CameraConfig, state: Path) -> None:
    """The camera's sound (audio/), when it has a source of it. An IP camera's own AAC
    configuration is remembered in ``<state>/aac-config`` (audio/pipeline.py), so HLS and
    recordings start with it after a restart instead of switching to it."""
    from ..audio.choice import resolve_audio

    kind, why = resolve_audio(cam)
    if kind == "none":
        camera.audio_reason = why
        return
    # Imported only for a camera with sound (numpy, two encoders: see _equip's motion note).
    from ..audio.pipeline import AAC_CONFIG_FILE, AudioPipeline
    from ..audio.sources import audio_source_for

    source, why = audio_source_for(kind, camera.pipeline.source)
    if source is None:
        camera.audio_reason = why
        return
    camera.audio = AudioPipeline(source, gain_db=cam.audio_gain_db, muted=cam.audio_muted,
                                 opus_bitrate=cam.audio_bitrate,
                                 aac_config_file=state / AAC_CONFIG_FILE if kind == "source"
                                 else None)


def motion_settings(cam: CameraConfig) -> MotionSettings:
    """The detector's settings from the camera's ``motion_*`` keys."""
    from ..motion.detector import MotionSettings  # numpy: see _equip
    zones = tuple(Zone.parse(text, include=True) for text in cam.motion_include) + tuple(
        Zone.parse(text, include=False) for text in cam.motion_exclude)
    return MotionSettings(sensitivity=cam.motion_sensitivity,
                          min_duration_s=cam.motion_min_duration_s,
                          off_delay_s=cam.motion_off_delay_s, min_gap_s=cam.motion_min_gap_s,
                          zones=zones)
