"""Engine tests import their toy provider module by name, as a replay would."""
import sys
from pathlib import Path

import pytest

from replay import registry

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(autouse=True)
def restore_providers():
    """`--code` swaps provider modules and ops in this process; put the originals back."""
    ops, path, provider = dict(registry._OPS), list(sys.path), sys.modules.get("toy_ops")
    yield
    registry._OPS.clear()
    registry._OPS.update(ops)
    sys.path[:] = path
    if provider is not None:
        sys.modules["toy_ops"] = provider
