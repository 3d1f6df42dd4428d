"""The load bench's input files: J jobs of R short chat requests (`max_tokens` 1) that share a few system prompts."""
from __future__ import annotations

import json
from pathlib import Path

TOPICS = ("weather", "cooking", "travel", "music", "history", "sports", "gardening", "science")
SYSTEM_PROMPTS = tuple(
    f"You are a concise assistant for questions about {topic}. Answer with one word, no punctuation, "
    f"no explanation. If the question is not about {topic}, answer with the word 'other'."
    for topic in TOPICS)


def custom_id(job: int, index: int) -> str:
    return f"j{job}-r{index}"


WORDS = ("river", "lantern", "copper", "meadow", "signal", "harbor", "orbit", "velvet", "quarry", "ember", "tundra",
         "cobalt", "prairie", "glacier", "saffron", "beacon")


UNPADDED_LINE_BYTES = 450  # a line's JSON around its padding (custom_id, body, system prompt, question)


def padding(index: int, chars: int) -> str:
    """About `chars` characters of words that vary by request (no shared prefix beyond the system prompt)."""
    words, size, k = [], 0, index
    while size < chars:
        k = (k * 1103515245 + 12345) & 0x7FFFFFFF
        words.append(WORDS[k % len(WORDS)])
        size += len(words[-1]) + 1
    return " ".join(words)


def request_line(job: int, index: int, system_prompts: int, max_tokens: int, line_bytes: int = 0) -> str:
    """line_bytes > 0: the user message is padded so the line is about that long (a 200 MB file of 50,000 lines)."""
    system = SYSTEM_PROMPTS[index % system_prompts]
    question = f"Question {index} of batch {job}: what comes next?"
    if line_bytes:
        question += " " + padding(index, line_bytes - UNPADDED_LINE_BYTES)
    body = {"model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    return json.dumps({"custom_id": custom_id(job, index), "method": "POST", "url": "/v1/chat/completions",
                       "body": body})


def write_job_files(directory: Path, jobs: int, requests: int, system_prompts: int = 4, max_tokens: int = 1,
                    line_bytes: int = 0) -> list[Path]:
    if not 1 <= system_prompts <= len(SYSTEM_PROMPTS):
        raise ValueError(f"system_prompts must be 1..{len(SYSTEM_PROMPTS)}, got {system_prompts}")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for job in range(jobs):
        path = directory / f"job-{job:03d}.jsonl"
        with open(path, "w") as out:
            for index in range(requests):
                out.write(request_line(job, index, system_prompts, max_tokens, line_bytes) + "\n")
        paths.append(path)
    return paths
