"""Load a converted model without transformers: safetensors weights, a `tokenizers` tokenizer, a jinja2 template.

Importing transformers costs seconds and hundreds of MB; the engine needs only the weights, the config, and a
tokenizer that encodes, decodes and renders the chat template. LightTokenizer gives the same ids as
transformers' apply_chat_template + encode (tests/engine/test_light_loader.py checks it).
"""
from __future__ import annotations

import json
import re
from functools import cached_property, lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from batchinfer.engine.loading.template_shapes import ShapeRenderer, contents_only_printed

ADDED_TOKENS = re.compile(r'"added_tokens"\s*:\s*')  # its first match is the top-level key (a string's quotes are escaped)


@lru_cache(maxsize=4)
def light_tokenizer(folder: Path) -> "LightTokenizer":
    """One tokenizer per model folder and process: validation and the engine share it (it is read-only)."""
    return LightTokenizer(folder)


class LightTokenizer:
    """tokenizer.json is read on first use (0.08-0.09 s): an engine process whose results its parent decodes
    (runtime/remote_generator.py) reads only the special tokens' ids, from the file's added_tokens."""

    def __init__(self, folder: Path):
        self._folder = folder
        self._backend: Any = None  # tokenizers.Tokenizer, once read
        config = _read_json(folder / "tokenizer_config.json")
        self.special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        self.eos_token = self.special["eos_token"]
        template = folder / "chat_template.jinja"
        self.chat_template = template.read_text() if template.exists() else config.get("chat_template")
        self._template: ShapeRenderer | None = None

    @property
    def _tok(self):
        if self._backend is None:
            from tokenizers import Tokenizer  # lazy: tokenizers, when a tokenizer loads

            self._backend = Tokenizer.from_file(str(self._folder / "tokenizer.json"))
        return self._backend

    @cached_property
    def eos_token_id(self) -> int | None:
        return self._special_id(self.eos_token)

    @cached_property
    def pad_token_id(self) -> int | None:
        return self._special_id(self.special["pad_token"])

    @property
    def loaded(self) -> bool:
        """Whether tokenizer.json has been read (the tests check who reads it)."""
        return self._backend is not None

    def _special_id(self, text: str | None) -> int | None:
        if text is None:
            return None
        if self._backend is None and text in self._added_ids:
            return self._added_ids[text]
        return self._tok.token_to_id(text)

    @cached_property
    def _added_ids(self) -> dict[str, int]:
        """tokenizer.json's added tokens (content -> id) without the vocabulary: the array is near the file's start
        and parsed alone (the special tokens are among them)."""
        text = (self._folder / "tokenizer.json").read_text()
        found = ADDED_TOKENS.search(text)
        if found is None:
            return {}
        try:
            tokens, _ = json.JSONDecoder().raw_decode(text, found.end())
        except ValueError:
            return {}
        return {t["content"]: t["id"] for t in tokens if isinstance(t, dict) and "content" in t and "id" in t}

    def __len__(self) -> int:  # as transformers' tokenizers: the vocabulary with its added tokens
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i, t in self._tok.get_added_tokens_decoder().items() if t.special]

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        """The token's vocabulary entry (byte-level pieces as they are stored), as transformers' name says."""
        return self._tok.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        # the same ids without each token's character offsets, which nothing here reads: twice as fast (tokenizers >= 0.21)
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=add_special_tokens)]

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = False, tokenize: bool = True, **variables):
        """variables: what else the template reads (tools, enable_thinking), as transformers passes them."""
        text = self._compiled().render(messages, add_generation_prompt, **variables)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def _compiled(self) -> ShapeRenderer:
        if self._template is None:
            if not self.chat_template:
                raise ValueError("the tokenizer has no chat template")
            from jinja2.sandbox import ImmutableSandboxedEnvironment  # lazy: jinja2, when a chat template renders

            # The same environment options transformers uses, so the rendering is identical.
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = _strftime_now
            env.filters["tojson"] = _tojson  # jinja's own escapes <, > and & as HTML: tool schemas would differ
            self._template = ShapeRenderer(env.from_string(self.chat_template),
                                           contents_only_printed(self.chat_template, env), self.special)
        return self._template


def model_config(folder: Path) -> SimpleNamespace:
    """The model's config.json as attributes (what the engine reads of a transformers PretrainedConfig)."""
    return SimpleNamespace(**_read_json(folder / "config.json"))


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors: model.safetensors, or the shards its index names; [] when neither."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return [folder / name for name in sorted(set(_read_json(index).get("weight_map", {}).values()))]
    single = folder / "model.safetensors"
    return [single] if single.exists() else []


def light_model(folder: Path):
    """The checkpoint's safetensors as the attribute tree the engine reads (model.layers[i].self_attn.q_proj...)."""
    from safetensors.torch import load_file  # lazy: safetensors' torch side

    config = model_config(folder)
    weights = {name: t for path in weight_files(folder) for name, t in load_file(str(path)).items()}
    tree = SimpleNamespace(config=config, generation_config=SimpleNamespace(**_read_json(
        folder / "generation_config.json")))
    for name, tensor in weights.items():
        _assign(tree, name.split("."), tensor)
    if not hasattr(tree, "lm_head"):  # tied embeddings: the file holds only embed_tokens
        tree.lm_head = SimpleNamespace(weight=tree.model.embed_tokens.weight)
    tree.model.layers = [tree.model.layers[str(i)] for i in range(config.num_hidden_layers)]
    return tree


def _assign(tree, parts: list[str], tensor) -> None:
    node = tree
    for part in parts[:-1]:  # "layers" holds a dict keyed by the layer number until light_model lists it
        if isinstance(node, dict):
            node = node.setdefault(part, SimpleNamespace())
        else:
            if not hasattr(node, part):
                setattr(node, part, {} if part == "layers" else SimpleNamespace())
            node = getattr(node, part)
    setattr(node, parts[-1], tensor)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    from datetime import datetime  # Llama 3.1's template dates its system prompt

    return datetime.now().strftime(fmt)


def _raise(message: str):
    raise ValueError(message)
