"""OpenAI's list pages: {"object": "list", "data", "first_id", "last_id", "has_more"}."""
from __future__ import annotations


def page(items: list[dict], limit: int) -> dict:
    """`items` holds up to limit + 1 rows: the extra one only says there is more."""
    shown = items[:limit]
    return {"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None, "has_more": len(items) > limit}
