"""``python -m hil``."""

import sys

from hil.cli import main

if __name__ == "__main__":
    sys.exit(main())
