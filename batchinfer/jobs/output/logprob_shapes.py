"""A result's logprobs in the OpenAI shapes: chat's `logprobs.content[]` and the legacy completions object."""
from __future__ import annotations


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")  # a token that splits a character shows U+FFFD; `bytes` keeps it exact


def chat_logprobs(entries) -> dict | None:
    if entries is None:
        return None
    content = [{"token": _text(e.token_bytes), "logprob": e.logprob, "bytes": list(e.token_bytes),
                "top_logprobs": [{"token": _text(b), "logprob": lp, "bytes": list(b)}
                                 for b, (_, lp) in zip(e.top_bytes, e.top)]}
               for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries) -> dict | None:
    """text_offset counts characters from the completion's start (vLLM without echo)."""
    if entries is None:
        return None
    tokens = [_text(e.token_bytes) for e in entries]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    top = [{_text(b): lp for b, (_, lp) in zip(e.top_bytes, e.top)} for e in entries]
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": top,
            "text_offset": offsets}
