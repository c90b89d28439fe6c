"""Message sizes and recipient counts for ``bench load``: small pure parsers and samplers.

Size specifications (``--size``), bytes with optional ``k``/``m`` suffixes (1024-based):

- ``2k``: every message 2048 bytes;
- ``1k-20k``: uniform between the two bounds (inclusive);
- ``lognormal:MEDIAN:SIGMA``: log-normal with that median and shape ``sigma`` (``MEDIAN``
  takes suffixes, ``SIGMA`` is a float), clamped to ``[MIN_SIZE, MAX_SIZE]``.

Counts (``--recipients``): ``N`` or ``LOW-HIGH`` (uniform). Parsers raise ``ValueError`` with a
message that names what was wrong; samplers take a ``random.Random`` so a worker can be seeded.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

MIN_SIZE = 0
MAX_SIZE = 64 * 1024 * 1024
_BYTES = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*")
_UNITS = {"": 1, "k": 1024, "m": 1024 * 1024}


def parse_bytes(text: str) -> int:
    """``"2k"`` -> 2048, ``"1.5m"`` -> 1572864, ``"300"`` -> 300."""
    match = _BYTES.fullmatch(text)
    if match is None:
        raise ValueError(f"not a byte count: {text!r} (use e.g. 300, 2k, 1.5m)")
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value > MAX_SIZE:
        raise ValueError(f"size {text!r} is above the limit of {MAX_SIZE} bytes")
    return value


@dataclass(frozen=True)
class Fixed:
    """Every message has ``size`` bytes."""

    size: int

    def sample(self, rng: random.Random) -> int:
        return self.size

    def describe(self) -> str:
        return f"{self.size} B"


@dataclass(frozen=True)
class Uniform:
    """Sizes uniform in ``[low, high]``."""

    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def describe(self) -> str:
        return f"uniform {self.low}-{self.high} B"


@dataclass(frozen=True)
class LogNormal:
    """Log-normal sizes: median ``median`` bytes, shape ``sigma``, clamped to the limits."""

    median: int
    sigma: float

    def sample(self, rng: random.Random) -> int:
        value = rng.lognormvariate(math.log(max(self.median, 1)), self.sigma)
        return max(MIN_SIZE, min(MAX_SIZE, round(value)))

    def describe(self) -> str:
        return f"lognormal median {self.median} B sigma {self.sigma:g}"


SizeSpec = Fixed | Uniform | LogNormal


def parse_size_spec(text: str) -> SizeSpec:
    """Parse a ``--size`` value (see the module docstring)."""
    stripped = text.strip()
    if stripped.lower().startswith("lognormal:"):
        parts = stripped.split(":")
        if len(parts) != 3:
            raise ValueError(f"not lognormal:MEDIAN:SIGMA: {text!r}")
        try:
            sigma = float(parts[2])
        except ValueError:
            raise ValueError(f"sigma is not a number in {text!r}") from None
        if not (0.0 <= sigma <= 5.0) or math.isnan(sigma):
            raise ValueError(f"sigma must be between 0 and 5 in {text!r}")
        return LogNormal(parse_bytes(parts[1]), sigma)
    if "-" in stripped:
        low_text, _, high_text = stripped.partition("-")
        low, high = parse_bytes(low_text), parse_bytes(high_text)
        if low > high:
            raise ValueError(f"the lower bound is above the upper one in {text!r}")
        return Fixed(low) if low == high else Uniform(low, high)
    return Fixed(parse_bytes(stripped))


@dataclass(frozen=True)
class CountRange:
    """A count uniform in ``[low, high]`` (``low == high``: fixed)."""

    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)


def parse_count_range(text: str, *, minimum: int = 1, maximum: int = 1000) -> CountRange:
    """``"3"`` -> 3..3, ``"1-5"`` -> 1..5, both bounds within ``[minimum, maximum]``."""
    low_text, _, high_text = text.strip().partition("-")
    if not low_text.strip().isdigit() or (high_text and not high_text.strip().isdigit()):
        raise ValueError(f"not a count or LOW-HIGH: {text!r}")
    low = int(low_text)
    high = int(high_text) if high_text else low
    if low > high or low < minimum or high > maximum:
        raise ValueError(f"count {text!r} must be within {minimum}..{maximum}, low <= high")
    return CountRange(low, high)
