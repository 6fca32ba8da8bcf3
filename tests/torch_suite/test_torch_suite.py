"""torch's distributed test suite on fsdist: see torch_dist_suite.py and docs/torch-suite.md.

pytest collects the one class, TestDistBackendWithSpawn; conftest.py picks which of its tests run.
"""

import pytest

# torch.testing._internal needs expecttest: the `torch-suite` extra, which scripts/test.sh installs
pytest.importorskip("expecttest", reason="pip install '.[torch-suite]'")

from torch_dist_suite import TestDistBackendWithSpawn

__all__ = ["TestDistBackendWithSpawn"]
