"""User text (custom_ids, metadata values, file names, values echoed in error messages) prints literally
through the CLI's commands: never read as rich markup, never turned into an emoji."""
import json
import re

from cli_helpers import batchinfer, cli_env
from jobfiles import completion_line

DUP = "[bold]dup[/bold] :smile:"
MODEL = "[red]other[/red] [/]"
METADATA = {"close": "[/]", "loud": "[bold]x[/bold]", "face": ":smile:", "slash": "end\\"}


def test_markup_and_emoji_codes_in_user_text_print_literally(tmp_path, model_cache):
    env = cli_env(tmp_path, model_cache)
    src = tmp_path / "[bold]in :smile:.jsonl"
    src.write_text("\n".join([completion_line(DUP, "hi"), completion_line(DUP, "again"),
                              completion_line("[/]", "hi", model=MODEL)]) + "\n")
    expected_errors = ["line 2: duplicate_custom_id (custom_id): The custom_id for this request is a duplicate",
                       f"'{DUP}' is used by an earlier line.",  # the same message, which a table may fold
                       f"line 3: model_not_found (body.model): The provided model '{MODEL}' is not supported by the"]
    meta = [arg for k, v in METADATA.items() for arg in ("--metadata", f"{k}={v}")]

    submitted = batchinfer(env, "submit", str(src), *meta)
    assert submitted.returncode == 2, submitted.stderr
    for line in expected_errors:
        assert line in submitted.stderr, submitted.stderr
    assert "error: line 2: " in submitted.stderr and "error: line 3: " in submitted.stderr
    job_id = re.search(r"job (batch_\w+) failed validation", submitted.stderr).group(1)

    status = batchinfer(env, "status", job_id)
    assert status.returncode == 1, status.stderr  # a failed job
    for text in [*expected_errors, "close=[/], loud=[bold]x[/bold], face=:smile:, slash=end\\", src.name]:
        assert text in status.stdout, (text, status.stdout)

    listed = batchinfer(env, "list")
    assert listed.returncode == 0 and job_id[:19] in listed.stdout, listed.stderr

    planned = batchinfer(env, "plan", str(src))
    assert planned.returncode == 2 and all(line in planned.stderr for line in expected_errors), planned.stderr
    assert "error: line 2: " in planned.stderr and "error: line 3: " in planned.stderr

    out, errors = tmp_path / "[i]out :smile:.jsonl", tmp_path / "[bold]errors.jsonl"
    downloaded = batchinfer(env, "download", job_id, "-o", str(out), "--errors", str(errors))
    assert f"wrote its error file to {errors}" in downloaded.stderr, downloaded.stderr
    for result in (submitted, status, listed, planned, downloaded):
        assert "Traceback" not in result.stdout + result.stderr and "😄" not in result.stdout + result.stderr


def test_run_prints_an_output_path_with_brackets_literally(tmp_path, model_cache):
    env = cli_env(tmp_path, model_cache)
    src = tmp_path / "in.jsonl"
    src.write_text(completion_line("[/] :smile:", "Hi", max_tokens=1) + "\n")
    out = tmp_path / "[bold]out :smile:.jsonl"
    result = batchinfer(env, "run", str(src), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert f"1 completed, 0 failed -> {out}" in result.stderr
    assert json.loads(out.read_text())["custom_id"] == "[/] :smile:"
