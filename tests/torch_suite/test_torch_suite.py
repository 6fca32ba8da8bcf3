"""torch's distributed test suite on fsdist: see torch_dist_suite.py and docs/torch-suite.md.

pytest collects the one class, TestDistBackendWithSpawn; conftest.py picks which of its tests run.
"""

try:
    import expecttest  # noqa: F401 - torch.testing._internal imports it
except ImportError as exc:  # never skipped silently: scripts/test.sh installs the extra
    raise ImportError("tests/torch_suite needs the torch-suite extra: pip install '.[torch-suite]'") from exc

from torch_dist_suite import TestDistBackendWithSpawn

__all__ = ["TestDistBackendWithSpawn"]
