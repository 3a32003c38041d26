# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""A stop's text as its cause and its fix, for the filters' message catalogs (each catalog a dict of
``Message`` by id, so that every text a user sees lives in one place and its tests pin it)."""

from __future__ import annotations

from typing import Any, NamedTuple


class Message(NamedTuple):
    """Text of one stop; ``cause`` and ``fix`` are ``str.format`` templates."""

    cause: str
    fix: str

    def text(self, **fields: Any) -> str:
        return f"{self.cause.format(**fields)} {self.fix.format(**fields)}"
