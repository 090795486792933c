"""Every configured camera with all its parts, built the same way (app.py's one call)."""

from __future__ import annotations

from pathlib import Path

from ..capture.controls import CameraControls
from ..clock import WallClock
from ..config import CameraConfig, Config
from ..events import EventBus, RecordingWatcher, StallWatcher
from ..hls import HlsStream
from ..recording import Recorder, RecorderSettings
from .camera import Camera, CameraSet
from .layout import camera_dir


def assemble_cameras(config: Config, *, clock: WallClock, events: EventBus) -> CameraSet:
    """One :class:`Camera` per configured camera, each with its controls (saved under
    ``<state>/cameras/<name>/``), recorder (``<recording.dir>/cameras/<name>/``, its share of
    ``recording.max_bytes``), HLS stream (``[hls] enable``) and watchers; the default camera
    is ``http.default_camera`` (else the first listed)."""
    configs = config.cameras
    rec = config.recording
    # recording.max_bytes bounds the whole recording disk: each camera keeps its share.
    share = rec.max_bytes // len(configs) if rec.max_bytes > 0 else 0
    archive = rec.directory(config.state.dir)
    state = Path(config.state.dir)
    cameras = []
    for cam_config in configs:
        camera = Camera(cam_config)
        _equip(camera, cam_config, config, archive=camera_dir(archive, camera.name),
               state=camera_dir(state, camera.name), share=share, clock=clock, events=events)
        cameras.append(camera)
    return CameraSet(cameras, default=config.http.default_camera)


def _equip(camera: Camera, cam: CameraConfig, config: Config, *, archive: Path, state: Path,
           share: int, clock: WallClock, events: EventBus) -> None:
    pipeline = camera.pipeline
    rec = config.recording
    camera.controls = CameraControls(pipeline.source, cam, state)
    recorder = camera.recorder = Recorder(RecorderSettings(
        directory=archive, continuous=rec.continuous, segment_s=rec.segment_s,
        preroll_s=rec.preroll_s, max_bytes=share, max_age_s=rec.max_age_hours * 3600),
        pipeline.ring, clock=clock)
    if config.hls.enable:
        camera.hls = HlsStream(
            pipeline.ring, framerate=cam.framerate, keyframe_interval=cam.keyframe_interval,
            part_target_s=config.hls.part_duration_s, window_s=config.hls.window_s,
            max_waiting=config.hls.max_waiting_requests)
    camera.stall_watcher = StallWatcher(
        events, lambda: pipeline.last_frame_monotonic, framerate=cam.framerate,
        source=pipeline.source_kind, camera=camera.name)
    camera.recording_watcher = RecordingWatcher(
        events, lambda: recorder.active, lambda: recorder.state, camera=camera.name)
