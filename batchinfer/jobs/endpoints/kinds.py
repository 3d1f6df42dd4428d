"""Every endpoint kind by url: the body its lines are checked with, and the result body its outputs carry."""
from __future__ import annotations

from typing import Callable

from batchinfer.jobs.endpoints import anthropic, anthropic_tools, chat, completions, embeddings, responses, responses_tools

Body = (chat.ChatBody | completions.CompletionBody | responses.ResponsesBody | embeddings.EmbeddingsBody
        | anthropic.Params)
# /v1/messages: the lines of a Message Batch (its params as they came), only in such a batch (intake.lines)
BODIES: dict[str, type[Body]] = {chat.CHAT_URL: chat.ChatBody, completions.COMPLETIONS_URL: completions.CompletionBody,
                                 responses.RESPONSES_URL: responses.ResponsesBody,
                                 embeddings.EMBEDDINGS_URL: embeddings.EmbeddingsBody,
                                 anthropic.MESSAGES_ENDPOINT: anthropic.Params}
URLS = tuple(BODIES)
KIND_NAMES = {chat.CHAT_URL: "Chat Completions", completions.COMPLETIONS_URL: "Completions",
              responses.RESPONSES_URL: "Responses", embeddings.EMBEDDINGS_URL: "Embeddings",
              anthropic.MESSAGES_ENDPOINT: "Messages"}  # as OpenAI's messages name them
# a field's rule comes from the last model that names it (line_problems.RULES); Anthropic's first, so that the fields
# it shares with OpenAI's bodies take theirs (a body's own top-level fields take its own rule)
MODELS = (anthropic.TextBlock, anthropic_tools.ToolUseBlock, anthropic_tools.ToolResultBlock, anthropic_tools.ToolChoice,
          anthropic.Message, anthropic.Params, chat.ToolCall, chat.FunctionCall, chat.ChatMessage, chat.ChatBody,
          completions.CompletionBody, responses.InputText, responses.InputMessage, responses_tools.FunctionCallItem,
          responses_tools.FunctionCallOutputItem, responses.ResponsesBody,
          embeddings.EmbeddingsBody)
ResultBody = Callable[..., dict]  # (request id, model, result, echo) -> body
_RESULT_BODIES: dict[str, ResultBody] = {chat.CHAT_URL: chat.result_body,
                                         completions.COMPLETIONS_URL: completions.result_body,
                                         responses.RESPONSES_URL: responses.result_body,
                                         anthropic.MESSAGES_ENDPOINT: chat.result_body}  # a Message at results time


def result_body(url: str, rid: str, model: str, results: list, echo: dict | None = None) -> dict:
    """The response body of a finished request: an embeddings line's results are one per input, in order."""
    if url == embeddings.EMBEDDINGS_URL:
        return embeddings.result_body(model, results, echo)
    return _RESULT_BODIES[url](rid, model, results[0], echo)


def reasoning_tokens(body: dict) -> int:
    """The reasoning tokens a result body's usage counts (chat's and Responses' shapes; 0 where there are none)."""
    usage = body.get("usage") or {}
    details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    return int(details.get("reasoning_tokens") or 0)
