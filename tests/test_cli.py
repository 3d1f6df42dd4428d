import json
import re
from datetime import datetime, timezone

import pytest

from cli_helpers import batchinfer, batchinfer_into_closed_pipe, cli_env
from jobfiles import chat_line, completion_line

COMMANDS = ["submit", "status", "list", "cancel", "download", "run", "worker", "db", "db upgrade", "bench", "bench load"]


@pytest.fixture
def env(tmp_path, model_cache):
    return cli_env(tmp_path, model_cache)


def _write(tmp_path, lines, name="in.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_run_writes_results_in_input_order(tmp_path, env):
    src = _write(tmp_path, [chat_line("q1", "Hi"), completion_line("q2", "The sky is"), chat_line("q3", "Bye")])
    out, errs = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    result = batchinfer(env, "run", src, "-o", str(out), "--errors", str(errs))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [o["custom_id"] for o in lines] == ["q1", "q2", "q3"]
    assert all(o["response"]["body"]["usage"]["completion_tokens"] >= 1 for o in lines)
    assert lines[0]["response"]["body"]["object"] == "chat.completion"
    assert lines[1]["response"]["body"]["object"] == "text_completion"
    assert "completed: 3 completed, 0 failed" in result.stderr and errs.read_text() == ""
    from batchinfer.engine.quant.kernel import supported  # weight_format auto, printed with its reason
    assert ("weights gguf (auto: the GGUF's own blocks" if supported() else "weights dense (auto:") in result.stderr
    if supported():
        assert lines[0]["metrics"]["weight_format"] == "gguf"


def test_bad_input_is_reported_by_line_and_code_without_a_traceback(tmp_path, env):
    src = _write(tmp_path, [
        chat_line("ok", "hi"), "{nope", '"a string"', json.dumps({"custom_id": "x"}), chat_line("ok", "again"),
        json.dumps({"custom_id": "u", "method": "POST", "url": "/v1/images", "body": {}}),
        chat_line("m", "hi", model="other-model"), completion_line("ctx", "word " * 50, max_tokens=8190),
        completion_line("f", "hi", top_p=0)])
    with open(src, "ab") as f:
        f.write(b'{"custom_id": "\xff"}\n')
    result = batchinfer(env, "run", src, "-o", str(tmp_path / "out.jsonl"))
    assert result.returncode == 2
    for expected in ["line 2: invalid_json_line", "line 3: invalid_request", "line 4: missing_required_parameter (method)",
                     "line 5: duplicate_custom_id (custom_id)", "line 6: invalid_url (url)",
                     "line 7: model_not_found (body.model)", "line 8: context_length_exceeded (body.prompt)",
                     "line 9: decimal_below_min_value (body.top_p)", "line 10: invalid_json_line"]:
        assert f"error: {expected}" in result.stderr  # every bad line, also the bodies that would fail alone
    assert "Traceback" not in result.stderr + result.stdout and not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("lines,settings,expected", [
    ([], {}, "file: empty_file"),
    ([completion_line(f"c{i}", "hi") for i in range(3)], {"BATCHINFER_MAX_REQUESTS_PER_FILE": "2"},
     "line 3: too_many_requests"),
])  # line_too_long and file_too_large take the same path; test_validation covers them
def test_file_limits_fail_the_job_with_a_clear_error(tmp_path, env, lines, settings, expected):
    src = _write(tmp_path, lines)
    result = batchinfer({**env, **settings}, "submit", src)
    assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr


def test_submit_with_skip_invalid_then_status_list_and_download(tmp_path, env):
    src = _write(tmp_path, [completion_line("good", "Two plus two is"), "not json"])
    result = batchinfer(env, "submit", src, "--skip-invalid", "--json", "--metadata", "team=search",
                        "--completion-window", "2h")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["status"] == "completed" and job["metadata"] == {"team": "search"}
    assert job["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert job["expires_at"] - job["created_at"] == pytest.approx(7200, abs=1)
    status = json.loads(batchinfer(env, "status", job["id"], "--json").stdout)
    assert status["usage"]["input_tokens"] > 0 and status["errors"]["data"][0]["code"] == "invalid_json_line"
    human = batchinfer(env, "status", job["id"])
    assert "completed" in human.stdout and "hit rate" in human.stdout
    listed = json.loads(batchinfer(env, "list", "--json").stdout)
    assert [j["id"] for j in listed] == [job["id"]]
    out, errs = tmp_path / "o.jsonl", tmp_path / "e.jsonl"
    assert batchinfer(env, "download", job["id"], "-o", str(out), "--errors", str(errs)).returncode == 0
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["good"]
    error = json.loads(errs.read_text())["error"]
    assert {k: error[k] for k in ("code", "line", "param")} == {"code": "invalid_json_line", "line": 2, "param": None}
    assert error["message"] == "This line is not parseable as valid JSON (Expecting value at character 1)."  # "not json"
    cancel = batchinfer(env, "cancel", job["id"])
    assert cancel.returncode == 1 and cancel.stderr.strip() == "error: Cannot cancel a batch with status 'completed'."


def test_errors_are_one_line_with_distinct_exit_codes(tmp_path, env):
    missing = batchinfer(env, "status", "batch_missing")
    assert missing.returncode == 3 and missing.stderr.strip() == "error: No batch found with id 'batch_missing'."
    no_file = batchinfer(env, "run", str(tmp_path / "absent.jsonl"), "-o", str(tmp_path / "o.jsonl"))
    assert no_file.returncode == 1 and no_file.stderr.strip().startswith("error: no such file")
    bad_setting = batchinfer({**env, "BATCHINFER_STORAGE_URL": "ftp://x"}, "list")
    assert bad_setting.returncode == 1 and len(bad_setting.stderr.strip().splitlines()) == 1
    no_broker = batchinfer(env, "worker")
    assert no_broker.returncode == 1 and "BATCHINFER_BROKER_URL" in no_broker.stderr
    bad_meta = batchinfer(env, "submit", _write(tmp_path, [chat_line("a", "b")]), "--metadata", "oops")
    assert bad_meta.returncode == 1 and "key=value" in bad_meta.stderr


def _failed_jobs(tmp_path, env, count: int) -> list[dict]:
    """Jobs that fail validation (one bad line each): quick to make, nothing runs."""
    src = _write(tmp_path, ["not json"])
    jobs = [json.loads(batchinfer(env, "submit", src, "--json").stdout) for _ in range(count)]
    assert all(job["status"] == "failed" for job in jobs)
    return jobs


def _table_rows(text: str) -> list[list[str]]:
    """The rows of a table the CLI printed, each cell's folded lines joined. Columns start where the
    header names do (names are two spaces apart); a row starts on a line with a status."""
    header, _rule, *lines = text.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    rows: list[list[str]] = []
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
        if cells[1]:
            rows.append(cells)
        else:
            rows[-1] = [old + new for old, new in zip(rows[-1], cells)]
    return rows


def test_list_at_80_columns_keeps_every_id_whole_on_one_line(tmp_path, env):
    jobs = _failed_jobs(tmp_path, env, 2)
    result = batchinfer({**env, "COLUMNS": "80"}, "list")
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert result.stdout.split()[:5] == ["id", "status", "done/total", "created", "(UTC)"]
    expected = [[j["id"], "failed", f"{j['request_counts']['completed'] + j['request_counts']['failed']}/"
                 f"{j['request_counts']['total']}", datetime.fromtimestamp(j["created_at"], timezone.utc).strftime("%m-%d %H:%M")]
                for j in reversed(jobs)]
    assert _table_rows(result.stdout) == expected and expected[0][2] == "1/1"
    assert [line.split()[0] for line in result.stdout.splitlines()[2:]] == [j["id"] for j in reversed(jobs)]
    wide = batchinfer({**env, "COLUMNS": "120"}, "list")
    assert wide.stdout.split()[:7] == ["id", "status", "completed", "failed", "total", "created", "(UTC)"]


@pytest.mark.fast
def test_every_commands_help_reads_whole_at_80_columns():
    import typer.main
    from typer.testing import CliRunner

    from batchinfer.cli.app import app

    def commands(group, path):
        for name, sub in getattr(group, "commands", {}).items():
            yield from commands(sub, [*path, name]) if hasattr(sub, "commands") else [[*path, name]]

    for path in commands(typer.main.get_command(app), []):
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80).output
        assert "\u2026" not in shown and max(len(line) for line in shown.splitlines()) <= 80, (path, shown)
    submit = CliRunner().invoke(app, ["submit", "--help"], env={"COLUMNS": "80"}, terminal_width=80).output
    assert "--completion-window" in submit and "--json" in submit and "for scripts" in submit


def test_output_into_a_pipe_whose_reader_has_gone_exits_quietly(tmp_path, env):
    job_id = _failed_jobs(tmp_path, env, 1)[0]["id"]
    for args in (["list"], ["list", "--json"], ["status", job_id, "--json"], ["status", job_id]):
        result = batchinfer_into_closed_pipe(env, *args)
        assert (result.returncode, result.stderr) == (1, ""), args


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    from typer.testing import CliRunner

    from batchinfer.cli.app import app

    result = CliRunner().invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def _longest_run(text: str, char: str) -> int:
    return max((len(run) for run in re.findall(f"{re.escape(char)}+", text)), default=0)


def test_lines_postgres_cannot_hold_fail_alone_and_huge_values_are_echoed_short(tmp_path, model_cache, postgres_url):
    env = cli_env(tmp_path, model_cache, BATCHINFER_DATABASE_URL=postgres_url)
    src = _write(tmp_path, [
        completion_line("good-1", "The sky is"), completion_line("i" * 600, "hi"), completion_line("nul\x00id", "hi"),
        completion_line("seed", "hi", seed=2**64), completion_line("huge", "hi", temperature="x" * 500_000),
        completion_line("good-2", "Two plus two is")])
    rejected = batchinfer(env, "submit", src, "--strict")  # the bodies too: nothing runs
    assert rejected.returncode == 2 and "Traceback" not in rejected.stderr
    for expected in ["line 2: string_above_max_length (custom_id)", "line 3: invalid_value (custom_id)",
                     "line 4: integer_above_max_value (body.seed)", "line 5: invalid_type (body.temperature)"]:
        assert expected in rejected.stderr
    assert _longest_run(rejected.stderr, "x") <= 200 and _longest_run(rejected.stderr, "i") <= 200
    result = batchinfer(env, "submit", src, "--skip-invalid", "--json")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["status"] == "completed" and job["request_counts"] == {"total": 6, "completed": 2, "failed": 4}
    status = batchinfer(env, "status", job["id"], "--json").stdout
    assert json.loads(status)["errors"]["count"] == 2 and _longest_run(status, "x") <= 200  # the bodies: their own 400
    out, errs = tmp_path / "o.jsonl", tmp_path / "e.jsonl"
    assert batchinfer(env, "download", job["id"], "-o", str(out), "--errors", str(errs)).returncode == 0
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["good-1", "good-2"]
    errors = [json.loads(line) for line in errs.read_text().splitlines()]
    assert [(e["custom_id"], e["error"]["line"], e["error"]["param"]) for e in errors] == [
        (None, 2, "custom_id"), (None, 3, "custom_id"), ("seed", 4, "body.seed"), ("huge", 5, "body.temperature")]
    assert [e["response"] and e["response"]["status_code"] for e in errors] == [None, None, 400, 400]
    assert _longest_run(errs.read_text(), "x") <= 200 and _longest_run(errs.read_text(), "i") <= 200


def test_a_refused_body_is_listed_before_anything_runs_and_fails_alone_unless_strict(tmp_path, env):
    src = _write(tmp_path, [completion_line("good", "Two plus two is"), completion_line("hot", "hi", temperature=9)])
    out = tmp_path / "o.jsonl"
    ran = batchinfer(env, "run", src, "-o", str(out), "--errors", str(tmp_path / "e.jsonl"))
    assert ran.returncode == 0, ran.stderr
    listed = ran.stderr.index("refused: line 2: decimal_above_max_value (body.temperature)")
    assert listed < ran.stderr.index("completed: 1 completed, 1 failed")  # listed first, then it ran
    assert [json.loads(raw)["custom_id"] for raw in out.read_text().splitlines()] == ["good"]
    (refused,) = [json.loads(raw) for raw in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert refused["response"]["status_code"] == 400 and refused["response"]["body"]["error"]["param"] == "temperature"
    strict = batchinfer(env, "submit", src, "--strict", "--json")
    assert strict.returncode == 2 and json.loads(strict.stdout)["status"] == "failed"
    assert json.loads(strict.stdout)["errors"]["data"][0]["code"] == "decimal_above_max_value"
    both = batchinfer(env, "submit", src, "--strict", "--skip-invalid")
    assert both.returncode == 2 and "cannot both be set" in both.stderr
    planned = batchinfer(env, "plan", src)  # the batch would run: the refused body is listed, the plan shown
    assert planned.returncode == 0 and "refused: line 2: decimal_above_max_value (body.temperature)" in planned.stderr


def test_download_errors_of_a_job_that_failed_validation_writes_its_error_file(tmp_path, env):
    src = _write(tmp_path, [completion_line("good", "hi"), "{nope", completion_line("good", "again")])
    failed = batchinfer(env, "submit", src, "--json")
    assert failed.returncode == 2
    job_id = json.loads(failed.stdout)["id"]
    out, errs = tmp_path / "o.jsonl", tmp_path / "e.jsonl"
    result = batchinfer(env, "download", job_id, "-o", str(out), "--errors", str(errs))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: job {job_id} has no output file; wrote its error file to {errs}"
    lines = [json.loads(line) for line in errs.read_text().splitlines()]
    assert [(e["error"]["line"], e["error"]["code"], e["custom_id"]) for e in lines] == [
        (2, "invalid_json_line", None), (3, "duplicate_custom_id", "good")]
    assert not out.exists()  # nothing ran: no results file, rather than an empty one that looks like success
    status = json.loads(batchinfer(env, "status", job_id, "--json").stdout)
    assert status["error_file_id"] is not None and status["output_file_id"] is None
