"""What text the store can hold: PostgreSQL refuses NUL characters and UTF-8 has no lone surrogates.

Checked at the edge (every request string and every path or query parameter) so that such text is
a 422 that names the field, never a store error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""NUL, and the surrogate range (in a Python str a surrogate is always a lone one)."""


def invalid_character(text: str) -> str | None:
    """A description of the first character the store cannot hold, or None (a regex scan: request
    bodies may carry megabytes of calibration text)."""
    found = UNSTORABLE.search(text)
    if found is None:
        return None
    code, position = ord(found.group()), found.start()
    if code == 0:
        return f"a NUL character (U+0000) at position {position}"
    return f"a lone surrogate (U+{code:04X}) at position {position}, which UTF-8 cannot encode"


def invalid_strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(field path, problem) for every string inside `value` (a JSON-like tree: dicts, lists,
    strings; keys count too) that holds a character the store cannot hold."""
    if isinstance(value, str):
        problem = invalid_character(value)
        if problem is not None:
            yield path or "(value)", problem
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and (problem := invalid_character(key)) is not None:
                yield f"{where} (the key)", problem
            yield from invalid_strings(item, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from invalid_strings(item, f"{path}[{index}]")
