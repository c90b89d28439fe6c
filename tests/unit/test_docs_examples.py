"""The configuration examples the documentation shows are valid configurations."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from mailsluice.settings.config import settings_from_mapping

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "configuration.md", ROOT / "docs" / "operations.md"]


def _examples() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for number, block in enumerate(re.findall(r"```toml\n(.*?)```", text, re.S)):
            found.append((f"{doc.name}#{number}", block))
    return found


def test_the_documents_have_examples() -> None:
    names = [name for name, _ in _examples()]
    assert "README.md#0" in names
    assert "configuration.md#0" in names


@pytest.mark.parametrize(("name", "block"), _examples(), ids=[n for n, _ in _examples()])
def test_an_example_is_a_valid_configuration(name: str, block: str) -> None:
    settings_from_mapping(tomllib.loads(block))
