"""Trust anchors read from a PEM file (``tls_ca_file``): every certificate of a bundle, none
from an empty or missing file. The rest of the runtime's pure TLS pieces are unit-tested in
``tests/unit/test_tls_runtime_pure.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from mailsluice.runtime.tls.policies import load_anchors

pytestmark = pytest.mark.integration


def test_anchors_from_a_pem_file(tmp_path: Path) -> None:
    bundle = tmp_path / "roots.pem"
    bundle.write_bytes(trustme.CA().cert_pem.bytes() + trustme.CA().cert_pem.bytes())
    assert load_anchors(str(bundle)) is not None
    empty = tmp_path / "empty.pem"
    empty.write_text("no certificate here\n")
    assert load_anchors(str(empty)) is None
    assert load_anchors(str(tmp_path / "missing.pem")) is None
