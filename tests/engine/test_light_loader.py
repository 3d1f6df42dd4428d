"""The light load path (safetensors + tokenizers + jinja2) against transformers: same ids, same text, same weights."""
from __future__ import annotations

from pathlib import Path

import torch

from batchinfer.engine.loading.light_loader import LightTokenizer, light_model

EXTRA = [[{"role": "user", "content": "Spaces  and\ttabs\n\nnew lines, é, 日本語, emoji 🙂, <|im_end|> inside text"}],
         [{"role": "system", "content": "  leading space"}, {"role": "user", "content": ""}]]


def test_light_tokenizer_gives_transformers_ids_on_every_test_prompt(loaded_model, chat_prompts):
    light, hf = LightTokenizer(Path(loaded_model.path)), loaded_model.tokenizer
    # the special ids come from tokenizer.json's added tokens without reading the vocabulary
    assert (light.eos_token_id, light.pad_token_id) == (hf.eos_token_id, hf.pad_token_id) and not light.loaded
    for messages in chat_prompts + EXTRA:
        text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert light.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == text
        ids = hf.encode(text, add_special_tokens=False)
        assert light.encode(text, add_special_tokens=False) == ids
        assert light.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
    assert light.eos_token_id == hf.eos_token_id
    # validation's batch call (encode_batch_fast: no offsets) gives each text's ids as transformers does
    texts = [hf.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in chat_prompts + EXTRA]
    for special in (False, True):
        assert light.encode_batch(texts, add_special_tokens=special) == [hf.encode(t, add_special_tokens=special) for t in texts]


def test_light_model_holds_the_same_weights_as_transformers(loaded_model):
    tree, hf = light_model(Path(loaded_model.path)), loaded_model.hf_model
    assert tree.config.num_hidden_layers == hf.config.num_hidden_layers == len(tree.model.layers)
    assert torch.equal(tree.model.embed_tokens.weight, hf.model.embed_tokens.weight)
    assert torch.equal(tree.lm_head.weight, hf.lm_head.weight)
    last = tree.model.layers[-1]
    assert torch.equal(last.self_attn.k_proj.weight, hf.model.layers[-1].self_attn.k_proj.weight)
    assert torch.equal(last.mlp.down_proj.weight, hf.model.layers[-1].mlp.down_proj.weight)


def test_a_conversion_finished_second_keeps_the_first_copy_and_leaves_no_temporary_folder(tmp_path):
    from batchinfer.engine.loading.loader import publish_dir

    target, late = tmp_path / "model", tmp_path / ".model.late"
    for folder, text in ((target, "first"), (late, "second")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    publish_dir(late, target)
    assert (target / "config.json").read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    fresh = tmp_path / ".other.tmp"
    fresh.mkdir()
    publish_dir(fresh, tmp_path / "other")
    assert (tmp_path / "other").is_dir() and not fresh.exists()
