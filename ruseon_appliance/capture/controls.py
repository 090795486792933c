"""Live camera controls: what each control is (type, range, default), which a source has and
whether it applies live or needs a source restart, the current values, and their persistence.

The config file's ``[camera]`` values are the defaults; what a person sets at run time
(``PATCH /api/camera/controls``, the device page) is kept in the state dir so a restart keeps it,
and setting a control to ``null`` returns it to the config's value. Sources that have controls
implement :class:`ControllableSource`; ``app.py`` connects this to the web layer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..config import AWB_MODES, CameraConfig

log = logging.getLogger(__name__)

CONTROLS_FILE = "camera-controls.json"
# Common sizes offered for ``resolution``, besides the configured one.
RESOLUTIONS = ("640x480", "1280x720", "1920x1080")


class ControlRejected(RuntimeError):
    """The camera did not run with the new values (it refused them, or no frame came): the
    previous values are back and running; ``str()`` says what happened, in one line."""


# How long a source restarted for new values may take to deliver its first frame with them
# before they count as refused (a Pi camera reconfigures in about a second).
RESTART_PROOF_S = 10.0


async def frames_arrived(count: Callable[[], int], before: int, timeout: float,
                         failed: Callable[[], str | None] = lambda: None) -> str | None:
    """Wait until ``count()`` exceeds ``before`` (a frame with the new values arrived): None,
    or why not (``failed()``'s reason, or the timeout). Checked every 20 ms: a control change
    is rare, and this keeps the sources' frame paths free of hooks."""
    deadline = asyncio.get_running_loop().time() + timeout
    while count() <= before:
        why = failed()
        if why is not None:
            return why
        if asyncio.get_running_loop().time() >= deadline:
            return f"no frame within {timeout:.0f} s"
        await asyncio.sleep(0.02)
    return None


class ControlsFile:
    """The persisted values (``camera-controls.json``, 0600), written in a worker thread.

    Every change hands over the newest values; one write runs at a time and a write that was
    overtaken by a newer change is never made (the last write wins), so a burst of PATCHes or
    MQTT sets costs at most two writes and the event loop never waits for ``fsync``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self.writes = 0

    def save(self, values: Mapping[str, Any]) -> None:
        """Write ``values`` soon (replacing whatever was waiting to be written)."""
        self._pending = dict(values)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name="camera-controls-save")

    async def flush(self) -> None:
        """Wait until everything handed over is on disk (shutdown, tests)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        while self._pending is not None:
            values, self._pending = self._pending, None
            await asyncio.to_thread(self.write, values)
            self.writes += 1

    def write(self, values: Mapping[str, Any]) -> None:
        """Write atomically (temporary file, fsync, rename); a failure is a warning."""
        tmp = self.path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            # O_CREAT's mode only applies to a new file: a .tmp left by a crash keeps its own.
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"values": dict(values)}, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())  # else a power cut after the rename can leave it empty
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot save camera controls to %s: %s", self.path, exc)


class ControlError(ValueError):
    """A control change is refused; ``control`` names it and ``str()`` says why, in one line."""

    def __init__(self, control: str, message: str) -> None:
        super().__init__(message)
        self.control = control


@dataclass(frozen=True, slots=True)
class ControlSpec:
    """One control: ``kind`` is ``int``, ``float``, ``bool`` or ``enum``."""

    name: str
    kind: str
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    unit: str = ""
    description: str = ""

    def range_text(self) -> str:
        """What is allowed, for error messages and the page."""
        if self.kind == "bool":
            return "true or false"
        if self.kind == "enum":
            return "one of " + ", ".join(self.choices)
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.minimum:g} to {self.maximum:g}{unit}"

    def coerce(self, value: Any) -> Any:
        """``value`` as this control's type, or :class:`ControlError` naming the range."""
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        bad = ControlError(self.name, f"{self.name} = {shown} is not valid: expected "
                                      f"{self.range_text()}")
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise bad
            return value
        if self.kind == "enum":
            if not isinstance(value, str) or value not in self.choices:
                raise bad
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad
        assert self.minimum is not None and self.maximum is not None
        # Compared before any conversion: JSON integers have no size limit, and float() or
        # math.isfinite() of a 400-digit one raises OverflowError (a 500, not a 422).
        if isinstance(value, int) and not self.minimum <= value <= self.maximum:
            raise ControlError(self.name, f"{self.name} = {shown} is out of range: "
                                          f"{self.range_text()}")
        if not math.isfinite(value):
            raise bad
        if self.kind == "int":
            if value != int(value):
                raise bad
            value = int(value)
        else:
            value = float(value)
        if not self.minimum <= value <= self.maximum:
            raise ControlError(self.name, f"{self.name} = {value!r} is out of range: "
                                          f"{self.range_text()}")
        return value

    def describe(self) -> dict[str, Any]:
        """The JSON ``GET /api/camera/controls`` shows (without the current value)."""
        out: dict[str, Any] = {"type": self.kind, "default": self.default}
        if self.kind in ("int", "float"):
            out.update(min=self.minimum, max=self.maximum)
        if self.kind == "enum":
            out["choices"] = list(self.choices)
        if self.unit:
            out["unit"] = self.unit
        if self.description:
            out["description"] = self.description
        return out


def catalog(camera: CameraConfig) -> dict[str, ControlSpec]:
    """Every control any source may have, with the config's values as defaults."""
    size = f"{camera.width}x{camera.height}"
    sizes = tuple(dict.fromkeys((size, *RESOLUTIONS)))
    specs = [
        ControlSpec("exposure_us", "int", camera.exposure_us, 0, 1_000_000, unit="µs",
                    description="exposure time; 0 = automatic"),
        ControlSpec("analogue_gain", "float", camera.gain, 0.0, 16.0,
                    description="analogue gain; 0 = automatic"),
        ControlSpec("awb", "enum", camera.awb, choices=AWB_MODES,
                    description="auto white balance mode"),
        ControlSpec("brightness", "float", 0.0, -1.0, 1.0),
        ControlSpec("contrast", "float", 1.0, 0.0, 32.0),
        ControlSpec("saturation", "float", 1.0, 0.0, 32.0),
        ControlSpec("sharpness", "float", 1.0, 0.0, 16.0),
        ControlSpec("hflip", "bool", camera.hflip),
        ControlSpec("vflip", "bool", camera.vflip),
        ControlSpec("bitrate", "int", camera.bitrate, 50_000, 50_000_000, unit="bit/s"),
        ControlSpec("framerate", "int", camera.framerate, 1, 120, unit="fps"),
        ControlSpec("resolution", "enum", size, choices=sizes),
    ]
    return {spec.name: spec for spec in specs}


def camera_with(camera: CameraConfig, values: Mapping[str, Any]) -> CameraConfig:
    """``camera`` with the controls that are ``[camera]`` settings replaced by ``values``."""
    changes: dict[str, Any] = {}
    for name, field in (("exposure_us", "exposure_us"), ("analogue_gain", "gain"),
                        ("awb", "awb"), ("hflip", "hflip"), ("vflip", "vflip"),
                        ("bitrate", "bitrate"), ("framerate", "framerate")):
        if name in values:
            changes[field] = values[name]
    if "resolution" in values:
        width, height = (int(n) for n in str(values["resolution"]).split("x"))
        changes.update(width=width, height=height)
    return dataclasses.replace(camera, **changes)


@runtime_checkable
class ControllableSource(Protocol):
    """A source with controls. ``controls`` maps each control it has to whether it applies
    live (True) or needs the source restarted (False)."""

    kind: str
    controls: Mapping[str, bool]

    async def apply_controls(self, values: Mapping[str, Any]) -> bool:
        """Apply ``values`` (every control the source has); True if the source restarted.
        Called before ``start`` too (the persisted values), which must not start anything.

        A restart is proven: it returns only once the source delivered a frame with the new
        values; otherwise it puts the previous values back, restarts with them and raises
        :class:`ControlRejected` saying why."""


class CameraControls:
    """The current values of one source's controls: validated, applied, persisted (0600)."""

    def __init__(self, source: object, camera: CameraConfig, state_dir: Path | None) -> None:
        self._any_source = source
        self._source = source if isinstance(source, ControllableSource) else None
        self._catalog = catalog(camera)
        # Every control's value (the config's until changed); only the source's are shown,
        # validated, applied and saved. A source may learn its controls at start (``auto``
        # once it has found the camera), so they are read from it each time.
        self.values: dict[str, Any] = {n: s.default for n, s in self._catalog.items()}
        self._path = state_dir / CONTROLS_FILE if state_dir is not None else None
        self.file = ControlsFile(self._path) if self._path is not None else None
        self.on_change: Callable[[dict[str, Any], bool], object] | None = None
        self.restarts = 0
        self.changes = 0
        self.rejected = 0
        # One change at a time (the API and MQTT both change controls; a restart takes a while).
        self._lock = asyncio.Lock()

    @property
    def kind(self) -> str:
        """The source's kind (``auto`` says the chosen source's once it has chosen)."""
        return str(getattr(self._any_source, "kind", "unknown"))

    @property
    def _live(self) -> Mapping[str, bool]:
        return self._source.controls if self._source is not None else {}

    @property
    def specs(self) -> dict[str, ControlSpec]:
        """The controls this source has, by name."""
        live = self._live
        return {n: s for n, s in self._catalog.items() if n in live}

    def _for_source(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` limited to the source's controls (all of them while it does not know its
        own yet: ``auto`` keeps them for the source it chooses)."""
        live = self._live
        return {k: v for k, v in values.items() if k in live} if live else dict(values)

    def describe(self) -> dict[str, Any]:
        """``GET /api/camera/controls``: each control's value, range and whether it applies
        live or restarts the source; ``unsupported`` lists what this source lacks."""
        return {
            "source": self.kind,
            "controls": {
                name: {"value": self.values[name], "live": self._live[name], **spec.describe()}
                for name, spec in self.specs.items()
            },
            "unsupported": [n for n in self._catalog if n not in self.specs],
        }

    def validate(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Check every change first (so a bad one changes nothing); ``None`` = the default."""
        checked: dict[str, Any] = {}
        for name, value in changes.items():
            spec = self.specs.get(name)
            if spec is None:
                if name in self._catalog:
                    raise ControlError(name, f"the {self.kind} source has no {name} control "
                                             f"(it has {', '.join(self.specs) or 'none'})")
                raise ControlError(name, f"unknown control {name!r}: known are "
                                         f"{', '.join(self._catalog)}")
            checked[name] = spec.default if value is None else spec.coerce(value)
        return checked

    async def update(self, changes: Mapping[str, Any]) -> bool:
        """Validate, apply and persist ``changes``; True if the source had to restart."""
        async with self._lock:
            return await self._update(changes)

    async def _update(self, changes: Mapping[str, Any]) -> bool:
        checked = self.validate(changes)
        if not checked:
            return False
        values = {**self.values, **checked}
        restarted = False
        if self._source is not None:
            try:
                restarted = await self._source.apply_controls(self._for_source(values))
            except ControlRejected as exc:
                # The source has the previous values back (and running): nothing is kept.
                self.rejected += 1
                log.warning("camera controls %s refused: %s",
                            ", ".join(f"{k}={v}" for k, v in checked.items()), exc,
                            extra={"EVENT": "camera_controls_rejected"})
                raise
        self.values = values
        self.changes += 1
        self.restarts += restarted
        self._save()
        log.info("camera controls changed: %s%s",
                 ", ".join(f"{k}={v}" for k, v in checked.items()),
                 " (source restarted)" if restarted else "")
        if self.on_change is not None:
            self.on_change(checked, restarted)
        return restarted

    async def restore(self) -> None:
        """Apply what the state dir kept (before the source starts); skip what no longer fits
        (a control the source lacks, a value out of today's range) with a warning."""
        saved = self._load()
        kept: dict[str, Any] = {}
        # A source that learns its controls at start (``auto``): check against every control
        # now; the one it chooses gets what it has.
        pending = self._source is not None and not self._live
        for name, value in saved.items():
            try:
                if pending and name in self._catalog:
                    kept[name] = self._catalog[name].coerce(value)
                else:
                    kept.update(self.validate({name: value}))
            except ControlError as exc:
                log.warning("ignoring the saved camera control: %s", exc)
        if kept:
            self.values = {**self.values, **kept}
            if self._source is not None:
                await self._source.apply_controls(self._for_source(self.values))
            log.info("camera controls restored from %s: %s", self._path,
                     ", ".join(f"{k}={v}" for k, v in kept.items()))

    def _load(self) -> dict[str, Any]:
        if self._path is None:
            return {}
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s (%s); using the config's camera settings", self._path,
                        exc)
            return {}
        values = data.get("values") if isinstance(data, dict) else None
        return dict(values) if isinstance(values, dict) else {}

    def _save(self) -> None:
        """Only what differs from the config is kept, so a config edit still takes effect for
        every control nobody touched at run time. Written off the loop (:class:`ControlsFile`)."""
        if self.file is None:
            return
        specs = self.specs
        self.file.save({n: v for n, v in self.values.items()
                        if n in specs and v != specs[n].default})

    async def flush(self) -> None:
        """Wait for the values file to be written (shutdown)."""
        if self.file is not None:
            await self.file.flush()
