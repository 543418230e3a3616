"""The install tests start clusters with the isolation tests' helpers (``from support import ...``)."""

import sys

from helpers import TESTS

sys.path.insert(0, str(TESTS / "isolation"))
