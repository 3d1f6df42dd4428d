import io
import os

import pytest

from batchinfer.storage import LocalStorage, S3Storage, open_storage


@pytest.fixture(params=[pytest.param("local", marks=pytest.mark.fast), "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return open_storage(f"file://{tmp_path}/files")
    return open_storage(request.getfixturevalue("s3_url"))


def test_round_trip_reads_line_by_line(storage):
    with storage.open_write("jobs/a/input.jsonl") as out:
        out.write(b"one\ntwo\nthree\n")
    with storage.open_read("jobs/a/input.jsonl") as stream:
        assert stream.readline(2) == b"on"
        assert list(stream) == [b"e\n", b"two\n", b"three\n"]
    assert storage.exists("jobs/a/input.jsonl") and not storage.exists("jobs/a/other.jsonl")


def test_a_failed_write_leaves_no_object(storage):
    with pytest.raises(RuntimeError):
        with storage.open_write("half.jsonl") as out:
            out.write(b"partial")
            raise RuntimeError("boom")
    assert not storage.exists("half.jsonl")


def test_reading_a_missing_key_raises_file_not_found(storage):
    with pytest.raises(FileNotFoundError):
        with storage.open_read("nope.jsonl"):
            pass


def test_upload_download_and_delete(storage):
    storage.upload("x/y.bin", io.BytesIO(b"abc" * 1000))
    target = io.BytesIO()
    storage.download("x/y.bin", target)
    assert target.getvalue() == b"abc" * 1000
    storage.delete("x/y.bin")
    assert not storage.exists("x/y.bin")


def test_s3_large_files_go_up_in_parts(s3_url):
    storage = open_storage(s3_url)
    assert isinstance(storage, S3Storage) and storage.prefix.endswith("/jobs-prefix")
    chunk = os.urandom(1024 * 1024)
    with storage.open_write("big.bin") as out:
        for _ in range(10):  # 10 MiB > one 8 MiB part
            out.write(chunk)
    head = storage.client.head_object(Bucket=storage.bucket, Key=f"{storage.prefix}/big.bin")
    assert head["ContentLength"] == 10 * 1024 * 1024
    assert head["ETag"].strip('"').endswith("-2")  # a multipart upload's ETag counts its parts
    with storage.open_read("big.bin") as stream:
        assert stream.read(len(chunk)) == chunk


@pytest.mark.fast
def test_local_keys_cannot_escape_the_root(tmp_path):
    storage = LocalStorage(tmp_path / "root")
    with pytest.raises(ValueError):
        storage.exists("../outside")


@pytest.mark.fast
def test_unknown_scheme_is_refused():
    with pytest.raises(ValueError):
        open_storage("gs://bucket")


def test_s3_writes_after_an_empty_object_stay_fast(s3_url):
    import time

    storage = open_storage(s3_url)
    started = time.time()
    for i in range(4):
        with storage.open_write(f"k{i}") as out:
            out.write(b"x" * 100 * (i % 2))
    assert time.time() - started < 20
