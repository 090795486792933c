"""Hardware-in-the-loop harness: judges a RUSEON device (real or simulated) as its viewers would.

Run ``python -m hil run --device http://HOST:8080`` (see ``hil/README.md``). The harness is an
independent client: it uses only the device's public interfaces and imports nothing from the
appliance except the stamp format (``ruseon_appliance.capture.stamp``).
"""
