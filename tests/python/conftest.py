import os
import zlib

import numpy as np
import pytest


def pytest_sessionstart(session):
    """scripts/wheel.sh runs the tests against an installed wheel: make sure that is the
    pagedmha they import (not a build tree on PYTHONPATH)."""
    prefix = os.environ.get("PAGEDMHA_EXPECT_PREFIX")
    if prefix:
        import pagedmha
        where = os.path.realpath(pagedmha.__file__)
        if not where.startswith(os.path.realpath(prefix) + os.sep):
            raise pytest.UsageError(f"pagedmha imported from {where}, expected under {prefix}")


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: fresh data per case, reproducible runs."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))
