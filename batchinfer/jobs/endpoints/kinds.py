"""Every endpoint kind by url: the body its lines are checked with, and the result body its outputs carry."""
from __future__ import annotations

from typing import Callable

from batchinfer.jobs.endpoints import chat, completions, embeddings, responses

Body = chat.ChatBody | completions.CompletionBody | responses.ResponsesBody | embeddings.EmbeddingsBody
BODIES: dict[str, type[Body]] = {chat.CHAT_URL: chat.ChatBody, completions.COMPLETIONS_URL: completions.CompletionBody,
                                 responses.RESPONSES_URL: responses.ResponsesBody,
                                 embeddings.EMBEDDINGS_URL: embeddings.EmbeddingsBody}
URLS = tuple(BODIES)
KIND_NAMES = {chat.CHAT_URL: "Chat Completions", completions.COMPLETIONS_URL: "Completions",
              responses.RESPONSES_URL: "Responses", embeddings.EMBEDDINGS_URL: "Embeddings"}  # as OpenAI's messages name them
# a field's rule comes from the last model that names it (line_problems.RULES): none of these disagree
MODELS = (chat.ChatMessage, chat.ChatBody, completions.CompletionBody, responses.InputText, responses.InputMessage,
          responses.ResponsesBody, embeddings.EmbeddingsBody)
ResultBody = Callable[..., dict]  # (request id, model, result, echo) -> body
_RESULT_BODIES: dict[str, ResultBody] = {chat.CHAT_URL: chat.result_body,
                                         completions.COMPLETIONS_URL: completions.result_body,
                                         responses.RESPONSES_URL: responses.result_body}


def result_body(url: str, rid: str, model: str, results: list, echo: dict | None = None) -> dict:
    """The response body of a finished request: an embeddings line's results are one per input, in order."""
    if url == embeddings.EMBEDDINGS_URL:
        return embeddings.result_body(model, results, echo)
    return _RESULT_BODIES[url](rid, model, results[0], echo)
