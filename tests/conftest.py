"""Suite-wide settings: Hypothesis profiles, so a local run and CI generate examples the same way.

No example database anywhere: a failure a developer once saw would otherwise be replayed first in
their runs only (from .hypothesis/), and a local run and CI would disagree about the same commit.
Regressions that matter are pinned with ``@example`` or a deterministic test instead. In CI
(``CI=true``) generation is also derandomized, so a red CI run is reproducible from the commit
alone; locally it stays random, which is where new cases are found (``print_blob`` prints the
reproduction). ``HYPOTHESIS_PROFILE=ci`` runs the CI examples locally.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", database=None, derandomize=True, print_blob=True)
settings.register_profile("dev", database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") == "true" else "dev"))
