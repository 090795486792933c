"""Motion detection and motion events, per camera (a room of its own: it reads a camera's
ring like any consumer and imports nothing of web/, engine/ or app.py).

- :mod:`.detector`: the algorithm (background, changed share, light-switch suppression);
- :mod:`.zones`: include/exclude polygons in normalised coordinates;
- :mod:`.tracker`: minimum duration, off-delay, minimum gap -> events;
- :mod:`.analyser`: the decode path (PyAV) and the lores path (picamera2's Y plane);
- :mod:`.store`: the events and their snapshots on disk, in the camera's recording folder;
- :mod:`.monitor`: the worker thread, the bounded backlog, the bus events.
"""

from .detector import Analysis, MotionDetector, MotionSettings
from .monitor import MotionMonitor
from .store import EventStore, StoredEvent
from .tracker import MotionTracker
from .zones import Zone

__all__ = ["Analysis", "EventStore", "MotionDetector", "MotionMonitor", "MotionSettings",
           "MotionTracker", "StoredEvent", "Zone"]
