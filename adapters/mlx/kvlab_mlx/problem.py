"""kvlab's canonical problem line, `op key=value ... seed=N`, parsed without kvlab.

The adapter reads the lines kvlab wrote, so it accepts exactly one problem per line (no
comma products, no comments) and keeps every value as text; the op functions convert
what they use. Keys a canonical line may leave out (kvlab's quiet defaults) are read
with an explicit default at the point of use.
"""

from __future__ import annotations

import re

_OP = re.compile(r"^[a-z][a-z0-9_]*$")
_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class Problem:
    def __init__(self, line: str):
        tokens = line.split()
        if not tokens:
            raise ValueError("empty problem line")
        if not _OP.match(tokens[0]):
            raise ValueError(f"problem line {line!r}: {tokens[0]!r} is not an op name")
        self.line = line
        self.op = tokens[0]
        self.params: dict[str, str] = {}
        for tok in tokens[1:]:
            key, eq, value = tok.partition("=")
            if not eq or not _KEY.match(key) or not value:
                raise ValueError(f"problem line {line!r}: {tok!r} is not key=value")
            if "," in value:
                raise ValueError(f"problem line {line!r}: {tok!r} is a product list, not one problem")
            if key in self.params:
                raise ValueError(f"problem line {line!r}: key {key!r} repeated")
            self.params[key] = value

    def __repr__(self):
        return f"Problem({self.line!r})"

    def _get(self, key, default):
        if key in self.params:
            return self.params[key]
        if default is None:
            raise ValueError(f"problem line {self.line!r} has no {key!r}")
        return default

    def word(self, key: str, default: str | None = None) -> str:
        return self._get(key, default)

    def int(self, key: str, default: int | None = None) -> int:
        text = self._get(key, None if default is None else str(default))
        if not re.fullmatch(r"-?[0-9]+", text):
            raise ValueError(f"problem line {self.line!r}: {key}={text} is not an integer")
        return int(text)

    def real(self, key: str, default: str | None = None) -> float:
        text = self._get(key, default)
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"problem line {self.line!r}: {key}={text} is not a number") from None

    def flag(self, key: str, default: int | None = None) -> bool:
        return self.int(key, default) != 0
