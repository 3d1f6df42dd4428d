"""Incremental detokenization equals a whole decode; a text cut by max_tokens ends in no partial character."""
from __future__ import annotations

from batchinfer.engine.scheduler.sequence import Sequence
from batchinfer.engine.sampling.stop_checker import REPLACEMENT_CHAR, StopChecker
from batchinfer.engine.types import SamplingParams

TEXT = "Prix: 12 € — café, naïve 日本語のテキスト 🙂🚀 done."


def _checker(tokenizer) -> StopChecker:
    return StopChecker(tokenizer, {tokenizer.eos_token_id}, 10_000)


def test_incremental_text_equals_the_whole_decode(loaded_model):
    tok = loaded_model.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    checker = _checker(tok)
    seq = Sequence("s", [1], SamplingParams(max_tokens=len(ids), stop=("NEVER-IN-TEXT",)))
    for t in ids:
        seq.token_ids.append(t)
        assert checker(seq) in (None, "length")
        assert not seq.text.endswith(REPLACEMENT_CHAR)  # held back until the character is whole
    assert seq.text == tok.decode(ids, skip_special_tokens=True) == TEXT


def test_stop_string_inside_multibyte_text_cuts_there(loaded_model):
    tok = loaded_model.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    checker = _checker(tok)
    seq = Sequence("s", [1], SamplingParams(max_tokens=len(ids), stop=("日本",)))
    for t in ids:
        seq.token_ids.append(t)
        if checker(seq) == "stop":
            break
    assert seq.text == TEXT[:TEXT.index("日本")]


def test_max_tokens_cut_inside_a_character_drops_the_partial_bytes(loaded_model):
    tok = loaded_model.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    cuts = [n for n in range(1, len(ids)) if tok.decode(ids[:n]).endswith(REPLACEMENT_CHAR)]
    assert cuts, "the test text must split a character somewhere"
    checker = _checker(tok)
    for n in cuts:
        seq = Sequence("s", [1], SamplingParams(max_tokens=n))
        seq.token_ids += ids[:n]
        seq.finish_reason = checker(seq)
        assert seq.finish_reason == "length"
        text = checker.final_text(seq)
        assert not text.endswith(REPLACEMENT_CHAR) and TEXT.startswith(text)


def test_the_stop_string_that_matched_first_is_the_stop_reason(loaded_model):
    tok = loaded_model.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    checker = _checker(tok)
    seq = Sequence("s", [1], SamplingParams(max_tokens=len(ids), stop=("café", "12", "NEVER")))
    for t in ids:
        seq.token_ids.append(t)
        if checker(seq) == "stop":
            break
    assert seq.stop_reason == "12" and seq.text == "Prix: "
    by_id = Sequence("t", [1], SamplingParams(max_tokens=len(ids), stop_token_ids=(ids[2],)))
    for t in ids:
        by_id.token_ids.append(t)
        if checker(by_id) == "stop":
            break
    assert by_id.stop_reason == ids[2]
    plain = Sequence("u", [1], SamplingParams(max_tokens=2))
    plain.token_ids += [tok.eos_token_id]
    assert checker(plain) == "stop" and plain.stop_reason is None  # EOS: no stop string, no stop token id
