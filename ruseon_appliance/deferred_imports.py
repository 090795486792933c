"""``import aiortc`` without PyAV and dnspython (issue 31, goal 5: fresh RSS).

aiortc imports PyAV (``av``: FFmpeg's libraries, about 20 MiB of RSS here) at module level in
most of its modules, and aioice imports dnspython (``dns``, a few MiB) for mDNS candidates.
The appliance's own sender path (``stream/``) uses neither: a board serving the file or the Pi
camera source with motion detection off needs PyAV only for a snapshot, an audio source or a
viewer on the stock aiortc sender path, and dnspython only for an ``.local`` (mDNS) candidate.

:func:`install` (called by the package's ``__init__``) puts a finder first in
``sys.meta_path``. While ``aiortc`` or ``aioice`` is being imported (its module code runs
inside a *phase*), ``av``, ``dns`` and their submodules resolve to stand-in modules whose
attributes are stand-ins (:class:`Deferred`) too: the name, a call of it, or ``|`` of two of
them, recorded and not evaluated (``aioice.mdns`` computes
``dns.rdataclass.RdataClass.make(dns.rdataclass.IN | 0x8000)`` at import).

Outside a phase, any real use of a stand-in resolves its whole package: a call, an attribute,
``isinstance``/``issubclass`` against it, subclassing it, an operator, an ``import av.x`` of a
submodule. Resolution removes the stand-in modules from ``sys.modules``, imports the real
package and each submodule that had a stand-in, evaluates every recorded stand-in, and replaces
each stand-in found in a loaded module's globals (``from av import VideoFrame``,
``import av``) by the real object: from then on aiortc's ``isinstance(frame, Frame)`` and
``av.Packet(...)`` run on the real classes, at full speed, and ``aiortc.mediastreams.VideoFrame
is av.VideoFrame``. A stand-in still held elsewhere (a function's annotations) keeps the real
object and hands every use over to it.

What a stand-in cannot do: ``type()`` and ``is`` see the stand-in, not the real object, until
its package is resolved (after that, module globals hold the real object). Code that only
*uses* them (calls, attributes, isinstance, operators) cannot tell the difference; aiortc and
aioice only use them.

The finder handles only top-level ``aiortc``/``aioice`` once, and submodules of a package whose
stand-in is still in ``sys.modules``; it removes itself when there is nothing left to do.
``EAGER_IMPORTS=1`` in the environment disables all of it (A/B measurements, debugging).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import operator
import os
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

# Packages replaced by stand-ins while a trigger is imported, and the triggers.
DEFERRED = ("av", "dns")
TRIGGERS = ("aiortc", "aioice")

_lock = threading.RLock()
_phase = 0  # depth of trigger imports in progress
_pending_triggers: set[str] = set()
_resolved: set[str] = set()
_standins: dict[str, StandInModule] = {}  # module name -> its stand-in, until resolved
_deferreds: dict[str, list[Deferred]] = {}  # top-level package -> its recorded stand-ins
_finder: _Finder | None = None
_UNSET: Any = object()


def enabled() -> bool:
    """Whether stand-ins are used (not with ``EAGER_IMPORTS=1``)."""
    return os.environ.get("EAGER_IMPORTS", "") not in ("1", "true", "yes")


def install() -> None:
    """Put the finder in place, unless disabled or every trigger is already imported."""
    global _finder
    if not enabled() or _finder is not None:
        return
    _pending_triggers.update(t for t in TRIGGERS if t not in sys.modules)
    if not _pending_triggers:
        return
    _finder = _Finder()
    sys.meta_path.insert(0, _finder)


def _maybe_uninstall() -> None:
    global _finder
    if _pending_triggers or _standins or _finder is None:
        return
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_finder)
    _finder = None


def deferred(name: str) -> bool:
    """Whether ``sys.modules[name]`` is a stand-in, not resolved yet."""
    return isinstance(sys.modules.get(name), StandInModule)


def real(obj: Any) -> Any:
    """The real object behind ``obj`` (resolving it), or ``obj`` itself."""
    if type(obj) is Deferred:
        return obj._ruseon_resolve()
    if type(obj) is StandInModule:
        resolve(obj.__name__.partition(".")[0])
        return sys.modules[obj.__name__]
    return obj


def resolve(top: str) -> None:
    """Import the real ``top`` package in place of its stand-ins (no-op once done)."""
    with _lock:
        if top in _resolved:
            return
        mine = {n: m for n, m in _standins.items() if n == top or n.startswith(top + ".")}
        if not mine:
            return
        for name, module in mine.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
        _resolved.add(top)
        try:
            reals = {name: importlib.import_module(name) for name in sorted(mine)}
        except BaseException:
            _resolved.discard(top)
            for name, module in mine.items():
                sys.modules.setdefault(name, module)
            raise
        for name, module in mine.items():
            del _standins[name]
            for key in [k for k in module.__dict__ if not _dunder(k)]:
                del module.__dict__[key]
            module.__dict__["__ruseon_real__"] = reals[name]
        for d in _deferreds.pop(top, []):
            d._ruseon_evaluate()
        _patch_globals(top)
        _maybe_uninstall()


def _patch_globals(top: str) -> None:
    """Replace this package's stand-ins in every loaded module's globals by the real objects."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            kind = type(value)
            if kind is Deferred and value._ruseon_top == top and value._ruseon_error is None:
                namespace[key] = value._ruseon_value
            elif kind is StandInModule and value.__name__.partition(".")[0] == top:
                namespace[key] = value.__dict__["__ruseon_real__"]


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class StandInModule(types.ModuleType):
    """A module of a deferred package: attributes are :class:`Deferred` inside a phase, the real
    module's outside (which resolves the package)."""

    def __getattr__(self, name: str) -> Any:
        namespace = self.__dict__
        real_module = namespace.get("__ruseon_real__")
        if real_module is not None:
            return getattr(real_module, name)
        if _dunder(name):
            # Introspection (typing, inspect.getmodule, pickle...) does not resolve.
            raise AttributeError(name)
        if _phase:
            value = Deferred(self.__name__.partition(".")[0], "attr", self, name)
            namespace[name] = value
            return value
        resolve(self.__name__.partition(".")[0])
        return getattr(namespace["__ruseon_real__"], name)

    def __repr__(self) -> str:
        return f"<deferred module {self.__name__!r}>"


def _binary(op: Callable[[Any, Any], Any], swap: bool = False) -> Callable[[Deferred, Any], Any]:
    def method(self: Deferred, other: Any) -> Any:
        left, right = (other, self) if swap else (self, other)
        if _phase:
            return Deferred(self._ruseon_top, "call", op, left, right)
        return op(real(left), real(right))
    return method


class Deferred:
    """A stand-in for an object of a deferred package (a class, a constant, a function), or for
    a call or an operator applied to such: the real object on first real use."""

    __slots__ = ("__weakref__", "_ruseon_args", "_ruseon_error", "_ruseon_kwargs", "_ruseon_op",
                 "_ruseon_top", "_ruseon_value")

    def __init__(self, top: str, op: str, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_ruseon_top", top)
        object.__setattr__(self, "_ruseon_op", op)
        object.__setattr__(self, "_ruseon_args", args)
        object.__setattr__(self, "_ruseon_kwargs", kwargs)
        object.__setattr__(self, "_ruseon_value", _UNSET)
        object.__setattr__(self, "_ruseon_error", None)
        _deferreds.setdefault(top, []).append(self)

    def _ruseon_evaluate(self) -> None:
        if self._ruseon_value is not _UNSET or self._ruseon_error is not None:
            return
        try:
            if self._ruseon_op == "attr":
                parent, name = self._ruseon_args
                value = getattr(real(parent), name)
            else:
                function, *args = (real(a) for a in self._ruseon_args)
                value = function(*args, **{k: real(v) for k, v in self._ruseon_kwargs.items()})
        except Exception as exc:  # kept, raised at each use
            object.__setattr__(self, "_ruseon_error", exc)
            return
        object.__setattr__(self, "_ruseon_value", value)
        object.__setattr__(self, "_ruseon_args", ())
        object.__setattr__(self, "_ruseon_kwargs", {})

    def _ruseon_resolve(self) -> Any:
        if self._ruseon_value is _UNSET:
            with _lock:
                resolve(self._ruseon_top)
                self._ruseon_evaluate()
            if self._ruseon_error is not None:
                raise self._ruseon_error
        return self._ruseon_value

    def _ruseon_name(self) -> str:
        if self._ruseon_op == "attr":
            parent, name = self._ruseon_args
            parent_name = parent.__name__ if type(parent) is StandInModule \
                else parent._ruseon_name()
            return f"{parent_name}.{name}"
        return f"{self._ruseon_top}.<expression>"

    def __getattr__(self, name: str) -> Any:
        if self._ruseon_value is not _UNSET:
            return getattr(self._ruseon_value, name)
        if _phase:
            if _dunder(name):
                raise AttributeError(name)  # typing's introspection of annotations
            return Deferred(self._ruseon_top, "attr", self, name)
        return getattr(self._ruseon_resolve(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._ruseon_resolve(), name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _phase and self._ruseon_value is _UNSET:
            return Deferred(self._ruseon_top, "call", self, *args, **kwargs)
        return self._ruseon_resolve()(*args, **kwargs)

    def __instancecheck__(self, instance: Any) -> bool:
        return isinstance(instance, self._ruseon_resolve())

    def __subclasscheck__(self, subclass: Any) -> bool:
        return issubclass(subclass, self._ruseon_resolve())

    def __mro_entries__(self, bases: Sequence[Any]) -> tuple[Any, ...]:
        return (self._ruseon_resolve(),)

    def __getitem__(self, key: Any) -> Any:
        return self._ruseon_resolve()[key]

    def __iter__(self) -> Any:
        return iter(self._ruseon_resolve())

    def __int__(self) -> int:
        return int(self._ruseon_resolve())

    def __index__(self) -> int:
        return operator.index(self._ruseon_resolve())

    def __str__(self) -> str:
        return str(self._ruseon_resolve())

    def __repr__(self) -> str:
        if self._ruseon_value is not _UNSET:
            return repr(self._ruseon_value)
        return f"<deferred {self._ruseon_name()}>"

    __or__ = _binary(operator.or_)
    __ror__ = _binary(operator.or_, swap=True)
    __and__ = _binary(operator.and_)
    __rand__ = _binary(operator.and_, swap=True)
    __xor__ = _binary(operator.xor)
    __add__ = _binary(operator.add)
    __radd__ = _binary(operator.add, swap=True)
    __sub__ = _binary(operator.sub)


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandInModule(spec.name)
        _standins[spec.name] = module
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _Loaded(importlib.abc.Loader):
    """Hands the import system a module already imported (by :func:`resolve`)."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set ours
        if self.spec is not None:
            module.__loader__ = self.spec.loader


class _PhaseLoader(importlib.abc.Loader):
    """The real loader of a trigger, its module code run inside a phase."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        global _phase
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        _phase += 1
        try:
            self.loader.exec_module(module)
        finally:
            _phase -= 1
            _maybe_uninstall()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in _pending_triggers:
            _pending_triggers.discard(fullname)
            spec: importlib.machinery.ModuleSpec | None = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
            if spec is None or spec.loader is None:
                return spec
            spec.loader = _PhaseLoader(spec.loader)
            return spec
        top = fullname.partition(".")[0]
        if top not in DEFERRED or top in _resolved:
            return None
        if fullname == top:
            if not _phase:
                return None
        elif not isinstance(sys.modules.get(top), StandInModule):
            return None
        elif not _phase:
            # A submodule of a stand-in outside a phase (aiortc.contrib.media's import
            # av.container): the real package, then the real submodule.
            resolve(top)
            return importlib.machinery.ModuleSpec(
                fullname, _Loaded(importlib.import_module(fullname)))
        return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)
