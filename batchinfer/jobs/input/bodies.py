"""Every input line body by url: the chat and completions bodies (input_line) and the newer endpoints'."""
from __future__ import annotations

from batchinfer.jobs.input import input_line
from batchinfer.jobs.input.embeddings_line import EMBEDDINGS_URL, EmbeddingsBody
from batchinfer.jobs.input.responses_line import RESPONSES_URL, InputMessage, InputText, ResponsesBody

Body = input_line.ChatBody | input_line.CompletionBody | ResponsesBody | EmbeddingsBody
BODIES: dict[str, type[Body]] = {**input_line.BODIES, RESPONSES_URL: ResponsesBody, EMBEDDINGS_URL: EmbeddingsBody}
# later models' field rules win in line_problems.RULES: ours name no field the older ones describe otherwise
MODELS = (*input_line.MODELS, InputText, InputMessage, ResponsesBody, EmbeddingsBody)
