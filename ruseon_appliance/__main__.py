"""``python -m ruseon_appliance`` is the ``ruseon`` command."""

import sys

from .cli import main

sys.exit(main())
