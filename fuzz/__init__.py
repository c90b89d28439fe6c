"""Coverage-guided fuzz targets (atheris) for the pure protocol core.

One module per target, ``fuzz_<name>.py``, each with ``test_one_input(data: bytes)`` that
raises on a crash or a broken invariant. Run them with ``scripts/fuzz``; the unit test
``tests/unit/test_fuzz_targets.py`` replays the seed corpora without atheris.
"""
