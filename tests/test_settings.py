import os

import pytest
from pydantic import ValidationError

from batchinfer.settings import Settings, parse_duration

pytestmark = pytest.mark.fast


def test_defaults_put_database_and_files_in_the_data_dir(tmp_path, monkeypatch):
    for name in [n for n in os.environ if n.startswith("BATCHINFER_")]:  # the defaults, not this shell's settings
        monkeypatch.delenv(name)
    monkeypatch.setenv("BATCHINFER_DATA_DIR", str(tmp_path))
    s = Settings()
    assert s.resolved_database_url == f"sqlite:///{tmp_path}/batchinfer.db"
    assert s.resolved_storage_url == f"file://{tmp_path}/files"
    assert s.embedded and s.model is None and s.model_id == "smollm2-135m-instruct"
    assert s.completion_window_s == 24 * 3600


def test_environment_overrides_with_the_batchinfer_prefix(monkeypatch):
    monkeypatch.setenv("BATCHINFER_BROKER_URL", "redis://localhost:6379/0")
    monkeypatch.setenv("BATCHINFER_STORAGE_URL", "s3://bucket/prefix")
    monkeypatch.setenv("BATCHINFER_MAX_REQUESTS_PER_FILE", "10")
    s = Settings()
    assert not s.embedded and s.resolved_storage_url == "s3://bucket/prefix" and s.max_requests_per_file == 10


@pytest.mark.parametrize("name,value", [("BATCHINFER_STORAGE_URL", "ftp://x"), ("BATCHINFER_MAX_LINE_BYTES", "0"),
                                        ("BATCHINFER_COMPLETION_WINDOW", "soon"), ("BATCHINFER_ENGINE", "vllm")])
def test_a_bad_setting_fails_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as info:
        Settings()
    assert name.removeprefix("BATCHINFER_").lower() in str(info.value).lower()


def test_visibility_timeout_is_longer_than_any_unit():
    s = Settings()
    assert s.visibility_timeout_s > s.unit_time_limit_s


@pytest.mark.parametrize("text,seconds", [("24h", 86400), ("30m", 1800), ("90s", 90), ("2d", 172800), ("5", 5)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_parse_duration_rejects_nonsense():
    with pytest.raises(ValueError):
        parse_duration("0h")
    with pytest.raises(ValueError):
        parse_duration("a week")


@pytest.mark.parametrize("text", ["1" + " " * 30_000 + "!", "1" + " " * 40, "99999999999999999999d", "31d", "1e3",
                                  "\u0967h", "1.", ""])
def test_parse_duration_refuses_hostile_text_within_bounds(text):
    with pytest.raises(ValueError):
        parse_duration(text, max_s=Settings().max_completion_window_s)
