import pytest

from batchinfer.jobs.endpoints import batch_line as formats
from batchinfer.engine.types import GenerationResult

pytestmark = pytest.mark.fast


def _result(n_tokens=5):
    return GenerationResult("r", list(range(n_tokens)), "hello", "length", prompt_tokens=10, cached_tokens=4,
                            arrival_time=100.0, first_scheduled_time=100.5, first_token_time=101.0,
                            last_token_time=103.0)


def test_chat_output_line_has_openai_shape_usage_and_metrics():
    line = formats.output_line("batch_1", 3, "c-3", "/v1/chat/completions", "m", [_result()], "w1")
    body = line["response"]["body"]
    assert line["custom_id"] == "c-3" and line["error"] is None and line["response"]["status_code"] == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                             "prompt_tokens_details": {"cached_tokens": 4}}
    assert line["metrics"] == {"queue_s": 0.5, "ttft_s": 1.0, "tpot_s": 0.5, "e2e_s": 3.0, "worker": "w1"}


def test_tpot_is_decode_time_over_tokens_after_the_first():
    assert formats.metrics(_result(101), "w")["tpot_s"] == round(2.0 / 100, 6)
    assert formats.metrics(_result(1), "w")["tpot_s"] == 0.0


def test_completion_output_line_is_a_text_completion():
    body = formats.output_line("b", 0, "c", "/v1/completions", "m", [_result()], "w")["response"]["body"]
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "hello"


def test_ids_are_deterministic_per_job_and_index():
    a = formats.output_line("b", 1, "c", "/v1/completions", "m", [_result()], "w")
    b = formats.output_line("b", 1, "c", "/v1/completions", "m", [_result()], "other")
    c = formats.output_line("b", 2, "c", "/v1/completions", "m", [_result()], "w")
    assert a["id"] == b["id"] != c["id"]


def test_error_line_sets_error_and_no_response():
    line = formats.error_line("b", 0, "c", "batch_expired", "too late", line=4)
    assert line["response"] is None and line["error"]["code"] == "batch_expired" and line["error"]["line"] == 4
