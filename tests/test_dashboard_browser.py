"""The dashboard in a real browser (Debian's headless Chromium driven by Playwright) against a real
`batchinfer serve` and a real worker on PostgreSQL, Redis and S3; ended batches' webhooks arrive signed."""
import json
import os
import shutil
import uuid

import pytest

from batchinfer.jobs.webhooks.signing import new_secret, verify
from batchinfer.settings import Settings
from cli_helpers import batchinfer, cli_env, wait_for
from jobfiles import chat_line
from benchmarks.support.services import free_port, start_cli, stop
from webhook_receiver import Receiver
from batchinfer.cluster.registry import open_registry

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_SECRET = new_secret()
SYSTEM = "You are a terse assistant who answers every question about numbers in one short sentence."



def _wait(condition, what: str, timeout: float = 180.0, every: float = 0.5):
    return wait_for(condition, what, timeout, every)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def stack(tmp_path, model_cache, postgres_url, s3_url, redis_server, s3_server):
    """A worker and an API server on free loopback ports; yields (env, base URL, worker name)."""
    pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    if not os.path.exists(CHROMIUM):
        pytest.skip("no /usr/bin/chromium: apt-get install -y chromium (.ci/run does)")
    env = cli_env(tmp_path, model_cache, BATCHINFER_DATABASE_URL=postgres_url, BATCHINFER_STORAGE_URL=s3_url,
                  BATCHINFER_BROKER_URL=f"{redis_server}/0", BATCHINFER_BROKER_PREFIX=f"bitest-{uuid.uuid4().hex[:8]}:",
                  BATCHINFER_DISPATCH_COUNTDOWN_S="0.5", BATCHINFER_MAX_REQUESTS_PER_UNIT="2",
                  BATCHINFER_WEBHOOK_SECRET=SERVER_SECRET, BATCHINFER_WEBHOOK_POLL_S="0.5",
                  BATCHINFER_WEBHOOK_ALLOW_PRIVATE="true", **s3_server)  # the receiver is on loopback
    assert batchinfer(env, "db", "upgrade").returncode == 0
    name, port = f"w{uuid.uuid4().hex[:6]}", free_port()
    worker = start_cli(env, tmp_path / "worker.log", "worker", "--name", name)
    server = start_cli(env, tmp_path / "server.log", "serve", "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    settings = Settings(broker_url=env["BATCHINFER_BROKER_URL"], broker_prefix=env["BATCHINFER_BROKER_PREFIX"])
    try:
        _wait(lambda: name in {w.name for w in open_registry(settings).live()} or worker.poll() is not None, "the worker")
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        _wait(lambda: _up(base) or server.poll() is not None, "the server", 60)
        assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        yield env, base, name
    finally:
        stop(server)
        stop(worker)


def _up(base: str) -> bool:
    import httpx

    try:
        return httpx.get(base + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _event_states(env, job_ids: list[str]) -> list[str]:
    from sqlalchemy import select

    from batchinfer.db.models import WebhookEvent
    from batchinfer.db.session import session_factory

    with session_factory(env["BATCHINFER_DATABASE_URL"])() as session:
        return sorted(session.scalars(select(WebhookEvent.status).where(WebhookEvent.job_id.in_(job_ids))))


def _key(env, name: str, *flags: str) -> dict:
    made = batchinfer(env, "keys", "create", "--name", name, "--json", *flags)
    assert made.returncode == 0, made.stderr
    return json.loads(made.stdout)


def _submit(base: str, key: str, lines: list[str], metadata: dict | None = None) -> str:
    import httpx

    auth = {"Authorization": f"Bearer {key}"}
    upload = httpx.post(base + "/v1/files", headers=auth, data={"purpose": "batch"},
                        files={"file": ("in.jsonl", ("\n".join(lines) + "\n").encode())}, timeout=30)
    assert upload.status_code == 200, upload.text
    batch = httpx.post(base + "/v1/batches", headers=auth, timeout=30,
                       json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions",
                             "completion_window": "24h", "metadata": metadata or {}})
    assert batch.status_code == 200, batch.text
    return batch.json()["id"]


def test_dashboard_shows_progress_and_groups_cancels_and_hides_other_keys(stack, receiver, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    env, base, worker = stack
    alice = _key(env, "alice", "--admin", "--webhook", receiver.url)
    bob = _key(env, "bob")
    bobs = _submit(base, bob["key"], [chat_line("b0", "Say hi")], metadata={"webhook_url": receiver.url})
    lines = [json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smollm2-135m-instruct", "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {i} plus {i}?"}]}})
        for i in range(64)]  # 32 units of 2: still running when the cancel lands on a fast CPU (a Zen 5 finished 16)
    alices = _submit(base, alice["key"], lines)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(base + "/?poll_ms=500")
        page.fill("#key", alice["key"])
        page.click("button[type=submit]")
        expect(page.locator("#who")).to_have_text("alice (admin)")
        row = page.locator(f"tr[data-id='{alices}']")
        expect(row).to_be_visible(timeout=60_000)
        row.click()

        def done_count():
            return int(row.locator("td").nth(4).inner_text().split("/")[0])  # Requests: done/total

        first = _wait(lambda: done_count() or None, "the first finished requests", 240)
        _wait(lambda: done_count() > first, "progress to move", 240)
        expect(page.locator("#d-groups tbody tr").first).to_be_visible()
        assert page.locator("#d-groups tbody tr").count() >= 1
        expect(page.locator("#w-table tbody tr", has_text=worker)).to_contain_text("alive")
        expect(page.locator(f"tr[data-id='{bobs}']")).to_be_visible()  # an admin key sees every batch
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"dashboard screenshot: {shot}")

        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#d-cancel")
        expect(page.locator("#d-status")).to_have_text("cancelled", timeout=120_000)
        expect(page.locator("#d-links a", has_text="Download output")).to_be_visible()
        page.click("#signout")
        page.fill("#key", bob["key"])
        page.click("button[type=submit]")
        expect(page.locator("#who")).to_have_text("bob")
        expect(page.locator(f"tr[data-id='{bobs}']")).to_be_visible(timeout=60_000)
        assert alices not in page.content()  # a tenant's key sees its own batches only
        browser.close()

    _wait(lambda: len(receiver.acknowledged()) >= 2, "both webhooks", 60)
    # a delivered event is never claimed again: once both rows say so, no duplicate can follow
    _wait(lambda: _event_states(env, [alices, bobs]) == ["delivered", "delivered"], "both events marked delivered", 60)
    events = {}
    for got in receiver.received:
        event = json.loads(got.body)
        verify(alice["webhook_secret"] if event["data"]["id"] == alices else SERVER_SECRET, got.headers, got.body)
        events.setdefault(event["data"]["id"], []).append(event["type"])
    assert events == {alices: ["batch.cancelled"], bobs: ["batch.completed"]}
    if os.environ.get("BATCHINFER_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["BATCHINFER_KEEP_SCREENSHOT"])
