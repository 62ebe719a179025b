import pytest

from .jspeer import ensure_js_deps, require_node


@pytest.fixture(scope="session")
def js_ready() -> None:
    """Node.js present (else skip) and the pinned js-libp2p packages installed."""
    require_node()
    ensure_js_deps()
