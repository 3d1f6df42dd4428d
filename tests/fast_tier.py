"""The fast tier's guard: a test marked `fast` may use neither the model nor a service.

Registered as a plugin (tests/conftest.py) rather than written as conftest hooks, because a conftest's
hooks do not see the set-up of session-scoped fixtures, which is where the services start.
"""
from __future__ import annotations

import pytest

# Each fixture that starts a service or loads the real model (or its tokenizer); the others build on these.
HEAVY_FIXTURES = frozenset({"postgres_server", "redis_server", "seaweed", "s3_server", "tokenizer", "generator",
                            "loaded_model"})


class FastTierGuard:
    def pytest_collection_modifyitems(self, items):
        for item in items:
            heavy = HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            if heavy and item.get_closest_marker("fast"):
                raise pytest.UsageError(f"{item.nodeid} is marked fast but uses {sorted(heavy)}: remove its fast mark")

    def pytest_fixture_setup(self, fixturedef, request):
        """A fixture looked up at run time (request.getfixturevalue) is caught here."""
        item = getattr(request, "_pyfuncitem", None)
        if fixturedef.argname in HEAVY_FIXTURES and item is not None and item.get_closest_marker("fast"):
            pytest.fail(f"{item.nodeid} is marked fast but sets up {fixturedef.argname}: remove its fast mark",
                        pytrace=False)
