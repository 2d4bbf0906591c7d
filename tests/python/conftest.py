import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: fresh data per case, reproducible runs."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))
