"""api.fair: the pool that shares the embedded server's validations and estimates between keys."""
from __future__ import annotations

import threading

import pytest

from batchinfer.api.fair import FairPool

pytestmark = pytest.mark.fast


def run_all(pool: FairPool, items: list[tuple[str, str]], gate: threading.Event) -> list[str]:
    """Submit (key, name) items while the pool's threads are held by `gate`'s first item; the order they ran."""
    ran: list[str] = []
    done = threading.Semaphore(0)

    def work(name: str):
        def run() -> None:
            if name == "hold":
                gate.wait(10)
            ran.append(name)
            done.release()
        return run

    for key, name in items:
        pool.submit(key, work(name))
    gate.set()
    for _ in items:
        assert done.acquire(timeout=10)
    return ran


def test_a_flooding_key_and_a_late_key_take_turns():
    pool = FairPool(threads=1)
    gate = threading.Event()
    items = [("a", "hold")] + [("a", f"a{i}") for i in range(4)] + [("b", "b0"), ("b", "b1"), ("c", "c0")]
    ran = run_all(pool, items, gate)
    pool.close()
    # a's flood came first, but once a had one item started the others' items go before a's next
    assert ran[:4] == ["hold", "b0", "c0", "a0"] and ran.index("b1") < ran.index("a2")
    assert ran.index("a0") < ran.index("a1") < ran.index("a2") < ran.index("a3")  # a key's own order kept


def test_one_key_never_holds_every_thread():
    pool = FairPool(threads=2, per_key=1)
    gate, other_ran = threading.Event(), threading.Event()
    pool.submit("a", lambda: gate.wait(10))
    for _ in range(3):
        pool.submit("a", lambda: gate.wait(10))
    pool.submit("b", other_ran.set)
    assert other_ran.wait(10)  # while a's first item still holds a thread and a's others wait
    assert pool.waiting("a") == 3
    gate.set()
    pool.close()


def test_a_failing_item_does_not_stop_the_pool():
    pool = FairPool(threads=1)
    ran = threading.Event()
    pool.submit("a", lambda: 1 / 0)
    pool.submit("a", ran.set)
    assert ran.wait(10)
    pool.close()
