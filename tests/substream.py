"""A camera with a sub-stream, for the sub-stream's consumers' tests (HLS, ONVIF, motion).

The sub-stream's core (issue 29: ``[[camera]] substream``, the sources that encode it, the
camera starting it) is built on another branch. Until it is merged these tests give a camera
its sub-stream themselves, exactly as the contract says the core will: ``Camera.sub`` is a
full :class:`CapturePipeline` (its own synthetic source, its own ring) whose ``camera`` has the
sub-stream's size, frame rate and bitrate, started and stopped with the main one.
:func:`cameras_with_substreams` makes :func:`assemble_cameras` (and so the real ``Appliance``)
build such cameras, so every consumer is wired by the production code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from ruseon_appliance.cameras import assembly
from ruseon_appliance.cameras.camera import Camera
from ruseon_appliance.capture.pipeline import CapturePipeline
from ruseon_appliance.capture.sources.synthetic import SyntheticSource
from ruseon_appliance.config import CameraConfig

SUB_SIZE = (640, 360)
SUB_BITRATE = 500_000


def sub_config(main: CameraConfig, size: tuple[int, int] = SUB_SIZE,
               bitrate: int = SUB_BITRATE) -> CameraConfig:
    """The sub-stream's camera: the main one's, at the sub-stream's size and bitrate."""
    return dataclasses.replace(main, width=size[0], height=size[1], bitrate=bitrate,
                               ring_bytes=0)


class CameraWithSub(Camera):
    """A :class:`Camera` whose sub-stream is a synthetic camera of its own."""

    sub_size = SUB_SIZE
    sub_bitrate = SUB_BITRATE
    sub_source = ""  # a source string for the sub-stream (e.g. ``file:clip.h264``)

    def __init__(self, config: CameraConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        sub = sub_config(config, self.sub_size, self.sub_bitrate)
        if self.sub_source:
            sub = dataclasses.replace(sub, source=self.sub_source)
            pipeline = CapturePipeline(sub)
        else:
            pipeline = CapturePipeline(sub, source=SyntheticSource(sub))
        # Once the core is merged, Camera attaches (and starts, supervises, stops) a sub-stream
        # itself: hand it this one. Before, this class starts and stops it.
        attach = getattr(super(), "attach_sub", None)
        self._core_runs_sub = attach is not None
        if attach is not None:
            attach(pipeline)
        else:
            self.sub = pipeline

    def add_substream(self, plan: object = None) -> CapturePipeline | None:
        """The core's own sub-stream from the configuration (assembly asks for it once it is
        merged): this camera has its sub-stream already."""
        return self.sub

    async def start(self) -> bool:
        if not self._core_runs_sub:
            assert self.sub is not None
            await self.sub.start()
        return await super().start()

    async def stop(self) -> None:
        await super().stop()
        if not self._core_runs_sub:
            assert self.sub is not None
            await self.sub.stop()


def cameras_with_substreams(monkeypatch: pytest.MonkeyPatch,
                            names: Iterable[str] | None = None, *,
                            size: tuple[int, int] = SUB_SIZE,
                            bitrate: int = SUB_BITRATE, source: str = "") -> None:
    """:func:`assemble_cameras` builds :class:`CameraWithSub` (for the cameras ``names``, or
    every one), their sub-streams at ``size`` and ``bitrate``, from ``source`` (a source
    string; default: a synthetic camera)."""
    wanted = None if names is None else set(names)
    kind = type("CameraWithThisSub", (CameraWithSub,),
                {"sub_size": size, "sub_bitrate": bitrate, "sub_source": source})

    def build(config: CameraConfig, **kwargs: Any) -> Camera:
        if wanted is None or config.name in wanted:
            camera: Camera = kind(config, **kwargs)
            return camera
        return Camera(config, **kwargs)

    maker: Callable[..., Camera] = build
    monkeypatch.setattr(assembly, "Camera", maker)
