"""Motion detection and motion events, per camera (a room of its own: it reads a camera's
ring like any consumer and imports nothing of web/, engine/ or app.py).

- :mod:`.detector`: the algorithm (background, changed share, light-switch suppression);
- :mod:`.zones`: include/exclude polygons in normalised coordinates (no numpy at import:
  config.py validates zones with it);
- :mod:`.tracker`: minimum duration, off-delay, minimum gap -> events;
- :mod:`.analyser`: the decode path (PyAV) and the lores path (a Y plane the ISP made);
- :mod:`.store`: the events and their snapshots on disk, in the camera's recording folder;
- :mod:`.monitor`: the worker thread, the bounded backlog, the bus events.

Nothing is imported here, so that importing :mod:`.zones` stays light.
"""
