"""One whole llama.cpp process for the whole-process bench: load the GGUF, serve a token file, print a summary.

Imports only llama_cpp, numpy and the multi-sequence driver, so its start-up is llama.cpp's own.
Input: JSON {"prompts": [[ids]], "max_tokens": n}, chat template already applied. Greedy, stops at EOS
(as `batchinfer run` does). Modes: file (one at a time, file order), sorted (one at a time, sorted by
prompt), batched (many sequence ids per llama_batch, shared prefix copied with llama_memory_seq_cp).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

MODES = ("file", "sorted", "batched")


def _one_at_a_time(gguf: str, threads: int, prompts: list[list[int]], max_tokens: int, sort: bool) -> list[int]:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=4096, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    eos, counts = llm.token_eos(), [0] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: prompts[i]) if sort else range(len(prompts))
    for i in order:  # generate() keeps the previous request's KV up to the common prefix
        for token in llm.generate(prompts[i], temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True):
            counts[i] += 1
            if token == eos or counts[i] == max_tokens:
                break
    return counts


def _batched(gguf: str, threads: int, prompts: list[list[int]], max_tokens: int) -> list[int]:
    from benchmarks.runners.llamacpp_batched import MultiSequenceLlama

    llm = MultiSequenceLlama(gguf, threads)
    try:
        return [len(s.tokens) for s in llm.generate(prompts, max_tokens, stop_at_eos=True)]
    finally:
        llm.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokens", help="JSON file with prompts and max_tokens")
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--mode", choices=MODES, default="batched")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    with open(args.tokens) as source:
        spec = json.load(source)
    started = time.time()
    if args.mode == "batched":
        counts = _batched(args.gguf, args.threads, spec["prompts"], spec["max_tokens"])
    else:
        counts = _one_at_a_time(args.gguf, args.threads, spec["prompts"], spec["max_tokens"], args.mode == "sorted")
    json.dump({"mode": args.mode, "output_tokens": sum(counts), "serve_s": time.time() - started}, sys.stdout)


if __name__ == "__main__":
    main()
