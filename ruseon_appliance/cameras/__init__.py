"""The appliance's cameras: one capture pipeline per configured camera, each started, watched
and retried on its own, so one failing camera never stops the others.

Only ``app.py`` builds a :class:`CameraSet`; the web layer reads it to map camera names to
feeds. The engine never sees names: it is handed a camera's pipeline per session.
"""

from ..capture.liveness import stale_after_s
from .camera import Camera, CameraSet, UnavailableSource

__all__ = ["Camera", "CameraSet", "UnavailableSource", "stale_after_s"]
