"""RUSEON Appliance: a LAN camera served over WHEP from one engine and one UDP port."""

from . import deferred_imports

__version__ = "0.1.0"

# Before anything imports aiortc: it then imports without PyAV and dnspython, which load on
# first use (deferred_imports.py; EAGER_IMPORTS=1 turns this off).
deferred_imports.install()
