"""Text a tenant names things with (filenames, metadata, webhook URLs): control and format characters
(NUL, newlines, bidi overrides such as U+202E) are refused, so nothing reaches PostgreSQL that it cannot
store, a log line or a listing that it could forge."""
from __future__ import annotations

import unicodedata

_REFUSED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})  # controls, format (bidi), surrogates, line/paragraph seps


def has_control(text: str) -> bool:
    return any(unicodedata.category(c) in _REFUSED for c in text)
