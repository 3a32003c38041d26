# Copyright: gpu-fleet maintainers
# Apache License 2.0 (see galaxy.yml)
"""A stop's text as its cause and its fix, for the filters' message catalogs (each catalog a dict of
``Message`` by id, so that every text a user sees lives in one place and its tests pin it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple


class Message(NamedTuple):
    """Text of one stop; ``cause`` and ``fix`` are ``str.format`` templates."""

    cause: str
    fix: str

    def text(self, **fields: Any) -> str:
        return f"{self.cause.format(**fields)} {self.fix.format(**fields)}"


def option_problems(
    options: dict[str, Any], rules: Iterable[tuple[str, str, Callable[[Any], bool]]], message: Message
) -> list[str]:
    """One ``message`` (fields ``name``, ``value``, ``rule``) per option of ``rules`` (``(name, rule, keeps)``, in the
    order they are named) whose value in ``options`` breaks its rule; an option that is none (left out of the
    inventory, or null there) is named as not set."""
    return [
        message.text(name=name, value="not set" if options.get(name) is None else options.get(name), rule=rule)
        for name, rule, keeps in rules
        if not keeps(options.get(name))
    ]
