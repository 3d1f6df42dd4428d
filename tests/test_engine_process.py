"""`batchinfer run` in two processes (batchinfer/runtime/engine_process.py): the same results and the same errors
as in one (BATCHINFER_ENGINE_PROCESS=0), and a dead engine process ends the run with one line, never a hang."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.process import children
from cli_helpers import batchinfer, cli_env
from jobfiles import chat_line

ONE_PROCESS = {"BATCHINFER_ENGINE_PROCESS": "0"}


def _comparable(line: str) -> tuple:
    """An output line less what differs between any two runs: ids, the creation time, the timings."""
    row = json.loads(line)
    body = (row["response"] or {}).get("body") or {}
    metrics = row.get("metrics") or {}
    return (row["custom_id"], body.get("model"), body.get("choices"), body.get("usage"), row["error"],
            metrics.get("worker"), metrics.get("dtype"), metrics.get("weight_format"))


def _requests(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(chat_line(f"r{i}", f"Name a colour, {i}.", max_tokens=4) + "\n" for i in range(3)))
    return path


def test_run_in_two_processes_writes_what_one_process_writes(tmp_path, model_cache):
    """The engine process leaves decoding to its parent (EngineConfig.detokenize): the same texts, a stop string's
    cut (found in the child), samples and logprobs' bytes included."""
    requests = _requests(tmp_path)
    with requests.open("a") as f:
        f.write(chat_line("stop", "Count from one to ten in words.", max_tokens=12, stop=[","]) + "\n")
        f.write(chat_line("n2", "Name a fruit.", max_tokens=5, n=2, temperature=0.8, seed=3) + "\n")
        f.write(chat_line("lp", "Say hello.", max_tokens=3, logprobs=True, top_logprobs=2) + "\n")
    two = batchinfer(cli_env(tmp_path, model_cache), "run", str(requests), "-o", str(tmp_path / "two.jsonl"))
    one = batchinfer(cli_env(tmp_path, model_cache, **ONE_PROCESS), "run", str(requests), "-o", str(tmp_path / "one.jsonl"))
    assert two.returncode == one.returncode == 0, two.stderr + one.stderr
    lines = {name: (tmp_path / f"{name}.jsonl").read_text().splitlines() for name in ("one", "two")}
    assert len(lines["two"]) == 6 and list(map(_comparable, lines["two"])) == list(map(_comparable, lines["one"]))
    texts = [c["message"]["content"] for line in lines["two"] for c in json.loads(line)["response"]["body"]["choices"]]
    assert len(texts) == 7 and all(texts)
    # the notes the model load prints reach the user from the engine process too
    assert [x for x in two.stderr.splitlines() if x.startswith(("dtype ", "weights "))] == \
           [x for x in one.stderr.splitlines() if x.startswith(("dtype ", "weights "))]


def test_a_model_the_engine_process_cannot_load_is_the_same_one_line_error(tmp_path, model_cache, tiny_model):
    # the tiny model has a tokenizer (validation passes) but no weights: the load fails in the engine process
    requests = _requests(tmp_path)
    args = ("run", str(requests), "-o", str(tmp_path / "out.jsonl"), "--model", tiny_model)
    two = batchinfer(cli_env(tmp_path, model_cache), *args, timeout=120)
    one = batchinfer(cli_env(tmp_path, model_cache, **ONE_PROCESS), *args, timeout=120)
    assert two.returncode == one.returncode == 1
    assert "Traceback" not in two.stderr and two.stderr.splitlines()[-1].startswith("error: ")
    assert two.stderr.splitlines()[-1] == one.stderr.splitlines()[-1]


def test_a_killed_engine_process_ends_the_run_with_one_line(tmp_path, model_cache):
    env = cli_env(tmp_path, model_cache)
    run = subprocess.Popen([sys.executable, "-m", "batchinfer.cli", "run", str(_requests(tmp_path)), "-o",
                            str(tmp_path / "out.jsonl")], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not children(run.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    (engine,) = children(run.pid)  # forked first thing, before the CLI's imports
    os.kill(engine, signal.SIGKILL)  # as the kernel's out-of-memory killer would
    stderr = run.communicate(timeout=120)[1]
    assert run.returncode == 1
    assert stderr.splitlines()[-1] == "error: the engine process was killed by SIGKILL (out of memory?)"
    assert "Traceback" not in stderr


def test_an_invalid_file_is_reported_as_in_one_process_and_the_engine_process_is_gone(tmp_path, model_cache):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"custom_id": "x", "method": "POST"}\n')
    args = ("run", str(bad), "-o", str(tmp_path / "out.jsonl"))
    run = subprocess.Popen([sys.executable, "-m", "batchinfer.cli", *args], env=cli_env(tmp_path, model_cache),
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not children(run.pid) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    engines = children(run.pid)
    stderr = run.communicate(timeout=120)[1]
    one = batchinfer(cli_env(tmp_path, model_cache, **ONE_PROCESS), *args)
    assert run.returncode == one.returncode == 2
    assert stderr.splitlines()[0] == one.stderr.splitlines()[0] and "Traceback" not in stderr
    assert all(not Path(f"/proc/{pid}").exists() for pid in engines)  # killed and reaped, not left to finish


def test_the_engine_process_collects_garbage_again_after_its_load_even_a_failed_one(monkeypatch):
    """The import and the load run with the cyclic GC off (engine_process._import_and_load); whatever the load
    does, the engine runs with it on, the loaded objects frozen out of its collections."""
    import gc

    from batchinfer.runtime import engine_process

    class Gone:  # the parent ended before sending the load: the child's recv raises
        def recv(self):
            assert not gc.isenabled(), "the load runs with the GC off"
            raise EOFError

    monkeypatch.setattr(engine_process, "_needs_torch", lambda: False)
    try:
        try:
            engine_process._import_and_load(Gone())
        except EOFError:
            pass
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_engine_process_is_sent_plain_settings_and_imports_no_pydantic():
    """The child forks before the CLI imports pydantic (0.13 s of its start, ahead of torch): what it is sent
    unpickles without it, and loads the same generator the settings name."""
    import pickle

    from batchinfer.runtime import engine_messages as msg
    from batchinfer.runtime.engine_host import EngineSettings, generator_key
    from batchinfer.settings import Settings

    settings = Settings(weight_format="dense", kv_block_size=32)
    sent = pickle.dumps(msg.Load(EngineSettings.of(settings)))
    child = ("import pickle, sys\n"
             "from batchinfer.runtime import engine_process, engine_host\n"
             f"load = pickle.loads({sent!r})\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'pydantic_settings', 'torch'}))\n"
             "print(engine_host.generator_key(load.settings))\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=True)
    imported, key = out.stdout.splitlines()
    assert imported == "[]"
    assert key == str(generator_key(settings)) and "'dense'" in key and ", 32," in key


def test_the_engine_process_reads_no_tokenizer_json_for_results_its_parent_decodes(model_cache):
    """Its parent decodes (EngineConfig.detokenize off): the load resolves the end-of-sequence id from the file's
    added tokens alone, and a plain request leaves tokenizer.json unread (0.09 s of the child's start). In a fresh
    process: this one's tokenizers are shared and may be loaded already."""
    child = ("from batchinfer.engine import EngineConfig, LLMEngine\n"
             "from batchinfer.engine.types import GenerationRequest, SamplingParams\n"
             f"engine = LLMEngine.from_pretrained(None, {str(model_cache)!r}, EngineConfig(detokenize=False))\n"
             "print(engine.tokenizer.loaded, sorted(engine.stop_checker.eos_token_ids))\n"
             "ids = [1, 9690, 198, 2683, 314, 260, 3575, 282, 4649, 47, 2]\n"
             "r, = engine.generate([GenerationRequest('r', ids, SamplingParams(max_tokens=3, temperature=0))])\n"
             "print(r.text_pending, repr(r.text), len(r.output_token_ids), engine.tokenizer.loaded)\n"
             "print(engine.tokenizer.eos_token_id == engine.tokenizer._tok.token_to_id(engine.tokenizer.eos_token))\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300, check=True)
    after_load, after_generate, same_eos = out.stdout.splitlines()
    assert after_load == "False [2]"
    assert after_generate == "True '' 3 False"
    assert same_eos == "True"


def test_a_setting_the_settings_refuse_is_one_line_and_the_engine_process_is_gone(tmp_path, model_cache):
    """The fork is decided from the environment (no pydantic before it); a value the settings then refuse is
    reported as in one process, and the engine process forked on it is ended, not left loading."""
    env = cli_env(tmp_path, model_cache, BATCHINFER_ENGINE_PROCESS="maybe")
    args = ("run", str(_requests(tmp_path)), "-o", str(tmp_path / "out.jsonl"))
    run = subprocess.Popen([sys.executable, "-m", "batchinfer.cli", *args], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not children(run.pid) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    engines = children(run.pid)
    stderr = run.communicate(timeout=120)[1]
    assert run.returncode == 1 and engines  # it forked on the environment's word
    assert stderr.splitlines() == ["error: invalid setting: BATCHINFER_ENGINE_PROCESS: Input should be a valid "
                                   "boolean, unable to interpret input, got 'maybe'"]
    assert all(not Path(f"/proc/{pid}").exists() for pid in engines)
