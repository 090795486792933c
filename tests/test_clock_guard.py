"""Durations are measured on the monotonic clock: a guard over the package's source.

A Raspberry Pi has no real-time clock; its wall clock steps (by days, backwards after a power cut)
when NTP or timesyncd sets it. Anything that subtracts or compares wall-clock readings then
measures that step: uptime going negative, sessions "400 days old", retention deleting what was
just recorded. This test parses every module of ``ruseon_appliance`` with :mod:`ast` and fails on

1. a wall-clock reading used in a subtraction or comparison: ``time.time()``/``time.time_ns()``
   themselves, a name or attribute assigned from one, or a call of a clock that defaults to
   ``time.time`` (``self.clock()`` where ``clock: Callable = time.time``);
2. any wall-clock reading not listed in :data:`WALL_TIME_USES` with the reason a wall timestamp
   (not a duration) is what is meant there, so a new one needs that decision.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ruseon_appliance"
WALL_FUNCTIONS = {"time", "time_ns"}  # time.time, time.time_ns

# (module path relative to the package, enclosing function) -> why wall time is meant there.
WALL_TIME_USES: dict[tuple[str, str], str] = {
    ("capture/sources/rtsp.py", "RtspSource._read_stream"):
        "an IP camera's audio packet is stamped with its arrival on the wall clock, as its "
        "pictures are (capture times are wall timestamps)",
    ("rtsp/audio.py", "RtspAudioTrack.send_report"):
        "a sender report's NTP time is the wall clock (RFC 3550), its RTP time the capture "
        "clock's (wall timestamps)",
    ("rtsp/session.py", "RtspSession.send_report"):
        "a sender report's NTP time is the wall clock (RFC 3550), its RTP time the capture "
        "clock's (wall timestamps)",
    ("stream/reports.py", "SenderReports.report"):
        "a sender report's NTP time is the wall clock by definition (RFC 3550), and its RTP "
        "time is placed by the capture time (a wall timestamp) of what was last sent",
    ("audio/sources/alsa.py", "AlsaSource.read"):
        "a chunk's capture time is a wall timestamp like a picture's (its arrival less its "
        "length), so outputs align sound and picture by it; no duration is measured",
    ("audio/sources/tone.py", "ToneSource.open"):
        "the tone's chunks are stamped on the wall clock like the synthetic pictures (its "
        "pacing is monotonic), so lip sync can be measured against the pictures' stamps",
    ("capture/sources/picamera.py", "PicameraSource._lores_time"):
        "a lores frame's capture time is a wall timestamp (its sensor time put on the wall "
        "clock once, by the offset at the first frame), as every access unit's",
    ("motion/store.py", "EventStore.__init__"):
        "events are dated in wall time (\"something happened at 14:02\"); ages are judged only "
        "while the clock is trusted (`trusted`), as the recordings' retention",
    ("onvif/device.py", "OnvifDevice.__init__"):
        "GetSystemDateAndTime answers the wall clock (clients compute their skew from it)",
    ("onvif/discovery.py", "DiscoveryResponder._header"):
        "WS-Discovery message headers carry wall timestamps",
    ("onvif/events.py", "EventService.__init__"):
        "the protocol's CurrentTime/UtcTime/TerminationTime are wall times; subscription "
        "lives run on the monotonic clock (EventService.monotonic)",
    ("onvif/security.py", "UsernameTokenVerifier.__init__"):
        "WS-Security's Created is a wall time, compared with the device's wall clock",
    ("stream/rtcp.py", "ntp_now"):
        "RTCP sender reports carry the NTP wall-clock time; `t - seconds` is its fraction",
    ("engine/session.py", "WhepSession.__init__"):
        "`created` is reported as a Unix timestamp in /api/status; ages use created_monotonic",
    ("engine/session.py", "WhepSession._on_state"):
        "`connected_at` is a reported Unix timestamp; the handshake time is monotonic",
    ("engine/session.py", "WhepSession.close"):
        "`closed_at` is a reported Unix timestamp; the session's age is monotonic",
    ("events/bus.py", "EventBus.__init__"):
        "an event's `time` is when it happened (webhooks, MQTT), a wall timestamp",
    ("hls/stream.py", "HlsStream.__init__"):
        "the first media sequence number is derived from the wall clock so a restarted "
        "service does not reuse numbers a player cached",
    ("webhooks/sender.py", "WebhookSender._post"):
        "the signature's timestamp is checked by the receiver against its own wall clock",
    ("capture/sources/file.py", "FileSource._play"):
        "an access unit's capture_time_us is the wall-clock time of the picture",
    ("capture/sources/synthetic.py", "SyntheticSource._run"):
        "an access unit's capture_time_us is the wall-clock time of the picture",
    ("capture/sources/rtsp.py", "RtspSource._emit"):
        "an access unit's capture_time_us is the wall-clock time of the picture",
    ("capture/sources/picamera.py", "Timeline.access_unit"):
        "an access unit's capture_time_us is the wall-clock time of the picture",
    ("capture/sources/rpicam.py", "RpicamSource._emit"):
        "an access unit's capture_time_us is the wall-clock time of the picture",
    ("engine/answer_template.py", "origin_line"):
        "the SDP origin's session id and version are NTP seconds now, as aiortc writes them "
        "(RFC 8866 5.2 suggests an NTP timestamp); an identifier, never compared",
    ("clock.py", "wall_us"):
        "the one reading of the wall clock the recorder's clock model starts from",
    ("clock.py", "WallClock.offset_us"):
        "realtime minus monotonic: how a step of the wall clock is seen",
    ("recording/recorder.py", "Recorder.begin"):
        "`started_at` is reported as when the recording began (a Unix timestamp)",
}


# Subtractions of wall readings that are not durations: (module, function) -> why.
NOT_DURATIONS: dict[tuple[str, str], str] = {
    ("audio/sources/tone.py", "ToneSource.open"):
        "the next whole 20 ms of the wall clock less now is how far the first chunk's stamp "
        "is moved to sit on that grid (once, at open), not a measured duration",
    ("stream/reports.py", "SenderReports.report"):
        "now minus the last packet's capture time places the report's RTP time on the capture "
        "clock (lip sync across streams); a step of the clock past CAPTURE_MAPPING_MAX_S "
        "falls back to the monotonic send time",
    ("audio/sources/alsa.py", "AlsaSource.read"):
        "arrival minus the chunk's length is when its first sample was captured: a timestamp",
    ("capture/sources/synthetic.py", "SyntheticSource._run"):
        "now less the thread's lateness behind its slot (measured on the monotonic clock) is "
        "the slot's moment on the wall clock, the picture's capture time: a timestamp",
    ("motion/store.py", "EventStore.prune"):
        "the age cutoff is a wall time compared with wall-dated events, and only taken while "
        "the clock is trusted",
    ("onvif/security.py", "UsernameTokenVerifier.role_of"):
        "WS-Security's Created is a wall time; the skew is judged only while the clock is "
        "synchronized",
    ("capture/sources/picamera.py", "PicameraSource._lores_time"):
        "wall minus the sensor's boot-time clock is the offset that dates lores frames once",
    ("stream/rtcp.py", "ntp_now"): "`t - seconds` is the fraction of the NTP timestamp",
    ("clock.py", "WallClock.offset_us"): "realtime minus monotonic is the offset, not a duration",
    ("recording/recorder.py", "Recorder._age_us"):
        "the wall-clock age of a segment recorded before this start-up, only while the clock "
        "is synchronized and the segment's time was trusted (else None: never aged out)",
}


@dataclass(frozen=True)
class Use:
    """One wall-clock reading in the source."""

    module: str
    function: str
    line: int
    text: str


def _is_wall_attr(node: ast.AST) -> bool:
    """``time.time`` / ``time.time_ns`` (the function, called or not)."""
    return (isinstance(node, ast.Attribute) and node.attr in WALL_FUNCTIONS
            and isinstance(node.value, ast.Name) and node.value.id == "time")


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))


def _scopes(tree: ast.Module) -> dict[ast.AST, tuple[str, str]]:
    """Every node -> (its class, its function's qualified name); '' where there is none."""
    out: dict[ast.AST, tuple[str, str]] = {}

    def walk(node: ast.AST, cls: str, function: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            out[child] = (cls, ".".join(function))
            if isinstance(child, ast.ClassDef):
                walk(child, child.name, [*function, child.name])
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, cls, [*function, child.name])
            else:
                walk(child, cls, function)
    walk(tree, "", [])
    return out


class _Taint:
    """What holds a wall-clock reading, found over the whole package (to a fixpoint).

    A local name is tracked in its function, ``self.x`` in its class; ``other.x`` (a session's
    ``created`` read in the metrics) is wall time when some class assigns ``self.x`` a wall
    reading and none assigns it a monotonic one.
    """

    def __init__(self, trees: list[tuple[str, ast.Module]]) -> None:
        self.values: set[tuple[str, ...]] = set()  # keys assigned a wall reading
        self.monotonic: set[str] = set()  # attribute names also assigned a monotonic reading
        self.clocks: set[tuple[str, ...]] = set()  # keys holding the function time.time
        self.functions: set[str] = set()  # functions returning a wall reading (wall_us())
        self.scopes = {module: _scopes(tree) for module, tree in trees}
        for _ in range(4):
            for module, tree in trees:
                self._scan(module, tree)

    def key(self, module: str, node: ast.AST, at: ast.AST) -> tuple[str, ...] | None:
        """Where ``node`` (a name or attribute, used at ``at``) is tracked."""
        cls, function = self.scopes[module].get(at, ("", ""))
        if isinstance(node, ast.Name):
            return (module, function, node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return (module, cls, "." + node.attr)
            return ("." + node.attr,)
        return None

    def is_wall(self, module: str, node: ast.AST) -> bool:
        """Does evaluating ``node`` give a wall-clock reading?"""
        if isinstance(node, ast.Call):
            if _is_wall_attr(node.func):
                return True
            name = (node.func.id if isinstance(node.func, ast.Name) else
                    node.func.attr if isinstance(node.func, ast.Attribute) else None)
            if name in self.functions:
                return True
            key = self.key(module, node.func, node)
            return key is not None and key in self.clocks
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.FloorDiv, ast.Mult,
                                                                ast.Div)):
            return self.is_wall(module, node.left) or (
                isinstance(node.op, ast.Add) and self.is_wall(module, node.right))
        if isinstance(node, (ast.Name, ast.Attribute)):
            key = self.key(module, node, node)
            if key is None:
                return False
            if len(key) == 1:  # someone else's attribute
                return key in self.values and key[0] not in self.monotonic
            return key in self.values
        if isinstance(node, ast.IfExp):
            return self.is_wall(module, node.body) or self.is_wall(module, node.orelse)
        return False

    @staticmethod
    def _is_monotonic(node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"monotonic", "monotonic_ns", "perf_counter"})

    def _scan(self, module: str, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    key = self.key(module, target, node)
                    if key is None:
                        continue
                    if self.is_wall(module, node.value):
                        self.values.add(key)
                        if isinstance(target, ast.Attribute):
                            self.values.add(("." + target.attr,))
                    elif self._is_monotonic(node.value) and isinstance(target, ast.Attribute):
                        self.monotonic.add("." + target.attr)
                    source = (self.key(module, node.value, node)
                              if isinstance(node.value, (ast.Name, ast.Attribute)) else None)
                    if _is_wall_attr(node.value) or (source is not None
                                                     and source in self.clocks):
                        self.clocks.add(key)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                positional = [*args.posonlyargs, *args.args]
                pairs = list(zip(positional[len(positional) - len(args.defaults):],
                                 args.defaults, strict=True))
                pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                          if d is not None]
                _cls, outer = self.scopes[module].get(node, ("", ""))
                function = f"{outer}.{node.name}" if outer else node.name
                for arg, default in pairs:
                    if _is_wall_attr(default):
                        self.clocks.add((module, function, arg.arg))
                if any(isinstance(x, ast.Return) and x.value is not None
                       and self.is_wall(module, x.value) for x in ast.walk(node)):
                    self.functions.add(node.name)


def _is_none_check(node: ast.AST) -> bool:
    return isinstance(node, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot))
                                                 for op in node.ops)


def _wall_uses() -> list[Use]:
    uses = []
    for module, tree in _modules():
        scope = _scopes(tree)
        for node in ast.walk(tree):
            if _is_wall_attr(node):
                uses.append(Use(module, scope.get(node, ("", ""))[1], node.lineno,
                                ast.unparse(node)))
    return uses


def duration_violations() -> list[str]:
    """Subtractions and comparisons with a wall-clock reading on either side, not allowed."""
    trees = list(_modules())
    taint = _Taint(trees)
    found = []
    for module, tree in trees:
        for node in ast.walk(tree):
            operands: list[ast.AST] = []
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
                operands = [node.left, node.right]
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Sub):
                operands = [node.target, node.value]
            elif isinstance(node, ast.Compare) and not _is_none_check(node):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.keyword) and node.arg in {"now", "now_s", "now_us"}:
                operands = [node.value]  # "now" handed to code that measures ages with it
            if not any(taint.is_wall(module, x) for x in operands):
                continue
            function = taint.scopes[module].get(node, ("", ""))[1]
            if (module, function) in NOT_DURATIONS:
                continue
            found.append(f"{module}:{node.lineno} in {function or '<module>'}: "
                         f"{ast.unparse(node)}")
    return found


def test_no_duration_is_measured_with_the_wall_clock() -> None:
    found = duration_violations()
    assert not found, ("wall-clock time used for a duration (use time.monotonic(), or add the "
                       "function to WALL_TIME_USES with the reason wall time is meant):\n  "
                       + "\n  ".join(found))


def test_every_wall_clock_reading_is_listed_with_its_reason() -> None:
    unlisted = [f"{u.module}:{u.line} in {u.function or '<module>'}: {u.text}"
                for u in _wall_uses() if (u.module, u.function) not in WALL_TIME_USES]
    assert not unlisted, ("wall-clock readings not in WALL_TIME_USES (a timestamp? say why; a "
                          "duration? use time.monotonic()):\n  " + "\n  ".join(unlisted))


def test_the_allow_list_has_no_stale_entries() -> None:
    used = {(u.module, u.function) for u in _wall_uses()}
    stale = sorted(set(WALL_TIME_USES) - used)
    assert not stale, f"WALL_TIME_USES entries no longer in the source: {stale}"


@pytest.mark.parametrize("source", [
    "import time\ndef f(t0):\n    return time.time() - t0\n",
    "import time\nclass S:\n    def __init__(self):\n        self.created = time.time()\n"
    "    def age(self):\n        return self.now - self.created\n",
    "import time\nclass A:\n    def __init__(self, clock=time.time):\n        self.clock = clock\n"
    "    def up(self, started):\n        return self.clock() - started\n",
    "import time\ndef old(seg):\n    return seg.end_us < time.time_ns() // 1000 - 5\n",
    "import time\ndef wall_us():\n    return time.time_ns() // 1000\n"
    "def age(seg):\n    return wall_us() - seg.end_us\n",
    "import time\ndef retention(archive):\n"
    "    return archive.expired(now_us=time.time_ns() // 1000)\n",
])
def test_the_guard_finds_the_patterns_it_is_for(source: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad.py").write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", tmp_path)
    assert duration_violations(), source
