"""The unit tier is pure: no sockets, files, databases, processes or real time
(``tests/support/pure_tier.py`` says what and why; ``tests/integration/test_unit_tier_guard.py``
sees each kind caught)."""

from __future__ import annotations

from tests.support import pure_tier

pure_unit_test = pure_tier.pure_unit_test
tmp_path = pure_tier.tmp_path
tmp_path_factory = pure_tier.tmp_path_factory
tmpdir = pure_tier.tmpdir
tmpdir_factory = pure_tier.tmpdir_factory
pytest_collection_modifyitems = pure_tier.pytest_collection_modifyitems
