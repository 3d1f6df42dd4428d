"""Idempotency keys (jobs/idempotency.py): one object per key and owner, 409 for another request under the key, and
of two creates racing under one key the one that commits second answers with the first one's object."""
from __future__ import annotations

import pytest

from batchinfer.db.session import transaction
from batchinfer.errors import InvalidRequest
from batchinfer.jobs import idempotency
from batchinfer.jobs.idempotency import Claim, IdempotencyConflict

pytestmark = pytest.mark.fast


class Objects:
    """Objects made under keys, as a create makes them: the key's row in the object's own transaction."""

    def __init__(self, ctx):
        self.ctx, self.made = ctx, {}

    def find(self, object_id: str):
        return self.made.get(object_id)

    def make(self, claim: Claim, object_id: str, before_commit=lambda: None):
        with transaction(self.ctx.sessions) as session:
            session.add(claim.row(object_id))
            before_commit()
        self.made[object_id] = object_id
        return object_id


def test_the_same_key_and_request_answer_with_one_object_and_another_request_is_a_conflict(make_context):
    ctx = make_context()
    objects = Objects(ctx)
    claim = Claim("owner", "batches", "k", idempotency.request_hash({"a": 1, "b": 2}))
    assert idempotency.once(ctx, claim, objects.find, lambda c: objects.make(c, "x")) == ("x", True)
    again = Claim("owner", "batches", "k", idempotency.request_hash({"b": 2, "a": 1}))  # keys in another order
    assert idempotency.once(ctx, again, objects.find, lambda c: objects.make(c, "y")) == ("x", False)
    other = Claim("owner", "batches", "k", idempotency.request_hash({"a": 3}))
    with pytest.raises(IdempotencyConflict, match="Conflict"):
        idempotency.once(ctx, other, objects.find, lambda c: objects.make(c, "z"))
    elsewhere = [Claim("another-owner", "batches", "k", other.request_hash), Claim("owner", "files", "k", other.request_hash)]
    assert [idempotency.once(ctx, c, objects.find, lambda c: objects.make(c, c.owner_id + c.scope))[1]
            for c in elsewhere] == [True, True]  # a key is one owner's, in one scope


def test_a_create_that_loses_the_race_answers_with_the_winners_object(make_context):
    ctx = make_context()
    objects = Objects(ctx)
    claim = Claim("owner", "batches", "k", idempotency.request_hash({"a": 1}))

    def winner_commits_first():  # the other create, all of it, while this one's transaction is open
        assert idempotency.once(ctx, claim, objects.find, lambda c: objects.make(c, "winner")) == ("winner", True)

    found = idempotency.once(ctx, claim, objects.find, lambda c: objects.make(c, "loser", winner_commits_first))
    assert found == ("winner", False) and "loser" not in objects.made


def test_a_key_whose_object_is_gone_is_free_again(make_context):
    ctx = make_context()
    objects = Objects(ctx)
    claim = Claim("owner", "files", "k", idempotency.request_hash({"a": 1}))
    idempotency.once(ctx, claim, objects.find, lambda c: objects.make(c, "first"))
    objects.made.clear()  # deleted since
    assert idempotency.once(ctx, claim, objects.find, lambda c: objects.make(c, "second")) == ("second", True)


@pytest.mark.parametrize("header, body, expected", [(None, None, None), ("a", None, "a"), (None, "b", "b"),
                                                    ("c", "c", "c")])
def test_the_header_and_the_body_field_are_one_key(header, body, expected):
    assert idempotency.the_key(header, body) == expected


@pytest.mark.parametrize("header, body", [("a", "b"), ("", None), ("x" * 256, None), ("a\nb", None)])
def test_two_keys_or_a_bad_key_are_refused(header, body):
    with pytest.raises(InvalidRequest) as refused:
        idempotency.the_key(header, body)
    assert refused.value.param == "idempotency_key"
