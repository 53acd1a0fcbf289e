"""``celery redislock web``: the dashboard's state, its refusal of actions, and the page in
a real headless chromium while a real worker runs limited tasks."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from celery_redislock import Semaphore
from celery_redislock.admin.cli import LockStore
from celery_redislock.admin.control import limit_state, pause
from celery_redislock.engine.admission import SlotLimit, admit
from celery_redislock.engine.keys import semaphore_key
from celery_redislock.web.app import STATIC, create_app
from celery_redislock.web.security import TOKEN_HEADER
from celery_redislock.web.state import Dashboard

from cli_app import CALL_API_PATIENT, CRAWL, api_name, create_worker_app
from cli_app import create_app as create_cli_app
from support import LOCK_DB, wait_until
from web_support import (
    PageServer,
    Served,
    WebCommand,
    browser,
    chromium,
    click,
    get_json,
    request,
    requested_urls,
    texts,
)
from worker_cluster import WorkerCluster

DESCRIPTION = '{"task": "cli_app.crawl", "worker": "w1@host", "pid": 123, "id": "task-1"}'
TOKEN = "t" * 8 + uuid.uuid4().hex
EVIL = "http://evil.example"


@pytest.fixture
def app(redis_server, lock_client):
    return create_cli_app(f"redis://127.0.0.1:{redis_server.port}/{LOCK_DB}")


@pytest.fixture
def held(app, lock_client):
    """The crawl task's semaphore (2 slots) with one task run holding a slot."""
    run = admit(lock_client, [SlotLimit(CRAWL, 2, "redislock:")], lease=30,
                owner="w1@host|task-1|", description=DESCRIPTION)
    assert run.fence
    return run


def serve(app, **options):
    dashboard = Dashboard(LockStore(app), min_interval=0, history=5)
    return Served(create_app(dashboard, control_app=app, **options)).start()


@pytest.fixture
def read_only(app, held):
    served = serve(app)
    yield served
    served.stop()


@pytest.fixture
def with_actions(app, held):
    served = serve(app, token=TOKEN)
    yield served
    served.stop()


def test_state_lists_every_key_with_holders_and_history(read_only, lock_client):
    other = Semaphore(lock_client, "other", slots=1)
    assert other.acquire(blocking=False) is not None
    pause(lock_client, "other", seconds=60)
    for _ in range(3):
        state = get_json(read_only.base + "api/state")
    rows = {row["name"]: row for row in state["keys"]}
    assert set(rows) == {CRAWL, "other"}
    crawl = rows[CRAWL]
    assert (crawl["used"], crawl["limit"], crawl["waiting"], crawl["paused"]) == (1, 2, 0, False)
    holder = crawl["holders"][0]
    assert (holder["task"], holder["task_id"], holder["worker"]) == (CRAWL, "task-1", "w1@host")
    assert holder["lease_left_seconds"] > 0 and holder["fence"] > 0
    assert [sample["used"] for sample in crawl["history"]] == [1, 1, 1]
    assert rows["other"]["paused"] and state["paused"] == ["other"]
    assert state["totals"] == {"keys": 2, "used": 2, "waiting": 0, "paused": 1}
    assert state["actions"] is False


def test_page_and_files_are_served_by_the_package_alone(read_only):
    status, headers, page = request(read_only.base)
    assert status == 200 and headers["content-type"].startswith("text/html")
    policy = headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert headers["x-frame-options"] == "DENY"
    for name in re.findall(rb'(?:src|href)="([^"]+)"', page):
        assert name.startswith(b"static/"), name  # relative: works under any sub-path
        assert request(read_only.base + name.decode())[0] == 200
    for path in STATIC.iterdir():  # nothing fetched from elsewhere (namespaces are names)
        text = re.sub(r"http://www\.w3\.org/2000/svg", "", path.read_text())
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), path.name
    assert request(read_only.base + "static/../app.py")[0] == 404


def test_actions_are_refused_without_the_flag(read_only, app):
    body = json.dumps({"action": "pause", "key": semaphore_key(CRAWL), "seconds": 60}).encode()
    status, _, answer = request(read_only.base + "api/action", method="POST", body=body,
                                headers={"Content-Type": "application/json",
                                         TOKEN_HEADER: TOKEN})
    assert status == 404 and b"--allow-actions" in answer
    assert not limit_state(app, CRAWL).paused


def refused(served, body, headers):
    return request(served.base + "api/action", method="POST", body=body, headers=headers)[0]


def test_actions_need_the_token_a_json_post_and_the_same_origin(with_actions, app):
    key = semaphore_key(CRAWL)
    body = json.dumps({"action": "pause", "key": key, "seconds": 60}).encode()
    json_type = {"Content-Type": "application/json"}
    assert refused(with_actions, body, json_type) == 403                       # no token
    assert refused(with_actions, body, {**json_type, TOKEN_HEADER: "x" * 32}) == 403
    assert refused(with_actions, body, {**json_type, TOKEN_HEADER: TOKEN, "Origin": EVIL}) == 403
    assert refused(with_actions, body, {**json_type, TOKEN_HEADER: TOKEN,
                                        "Sec-Fetch-Site": "cross-site"}) == 403
    # What a forged cross-site form sends: a form body, its origin, no custom header.
    form = f"action=pause&key={key}&seconds=60&token={TOKEN}".encode()
    assert refused(with_actions, form, {
        "Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL,
        "Sec-Fetch-Site": "cross-site"}) == 403
    assert refused(with_actions, form, {
        "Content-Type": "text/plain", TOKEN_HEADER: TOKEN}) == 403
    assert request(with_actions.base + "api/action?action=pause&key=" + key)[0] == 403
    assert not limit_state(app, CRAWL).paused
    assert get_json(with_actions.base + "api/state")["keys"][0]["holder_count"] == 1


def test_actions_with_the_token_go_through_control(with_actions, app):
    base, key = with_actions.base, semaphore_key(CRAWL)
    headers = {"Content-Type": "application/json", TOKEN_HEADER: TOKEN,
               "Origin": base.rstrip("/")}

    def act(**body):
        status, _, answer = request(base + "api/action", method="POST", headers=headers,
                                    body=json.dumps(body).encode())
        return status, json.loads(answer)

    assert act(action="pause", key=key, seconds=60)[0] == 200
    assert limit_state(app, CRAWL).paused
    assert act(action="resume", key=key)[0] == 200
    assert act(action="set-slots", key=key, slots=5)[0] == 200
    assert limit_state(app, CRAWL).limit == 5
    assert act(action="set-slots", key=key, slots=0)[0] == 400
    assert act(action="clear-slots", key=key)[0] == 200
    holder = get_json(base + "api/state")["keys"][0]["holders"][0]["token"]
    status, answer = act(action="release", key=key, holder=holder)
    assert status == 200 and holder in answer["message"]
    assert limit_state(app, CRAWL).used == 0
    assert act(action="pause", key=semaphore_key("never-seen"))[0] == 400
    assert not limit_state(app, "never-seen").paused


def test_actions_flag_needs_a_long_token(app, monkeypatch, tmp_path):
    from celery.bin.base import CLIContext
    from click.testing import CliRunner

    from celery_redislock.web.command import redislock

    monkeypatch.delenv("REDISLOCK_WEB_TOKEN", raising=False)
    obj = CLIContext(app=app, no_color=True, workdir=None, quiet=True)
    for args in (["--allow-actions"], ["--allow-actions", "--token", "short"]):
        result = CliRunner().invoke(redislock, ["web", *args], obj=obj)
        assert result.exit_code == 1 and "token" in result.output, result.output


# --- the page in a real browser, while a real worker runs limited tasks ----------------


@pytest.fixture(scope="module")
def executables():
    found = chromium()
    if found is None:
        pytest.skip("no chromium and chromedriver on PATH (apt-get install chromium "
                    "chromium-driver)")
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, executables):
    with WorkerCluster(tmp_path_factory.mktemp("web-workers"), app_module="cli_app",
                       app_factory=create_worker_app, workers=1, concurrency=2) as running:
        yield running


@pytest.mark.slow
def test_page_shows_holders_live_and_asks_only_its_own_server(cluster, executables, tmp_path):
    """Two runs of one token (one slot): the page shows the first holding and the second
    parked; when the first ends, the page shows the second holding, with no reload;
    every request the page made went to the dashboard's own server."""
    from selenium.webdriver.common.by import By

    token = uuid.uuid4().hex[:12]
    name, app = api_name(token), cluster.app
    records = cluster.redis.client(db=3)
    first = app.send_task(CALL_API_PATIENT, (token,), {"hold": True})
    wait_until(lambda: records.hexists("started", first.id), timeout=30,
               what="the first run to start")
    second = app.send_task(CALL_API_PATIENT, (token,), {"hold": True})
    wait_until(lambda: limit_state(app, name).waiting == 1, timeout=30,
               what="the second run to wait (parked: one message in the broker)")
    web = WebCommand("cli_app", cluster._worker_environment(cluster.urls),
                     tmp_path / "web.log", "--interval", "0.5").start()
    driver = browser(executables)
    try:
        driver.get(web.base)

        of_key = f'[data-key="{semaphore_key(name)}"]'
        row = f"tr.detail{of_key}"
        # Without a click: who holds it, with the run's arguments as Celery wrote them
        # (its argsrepr and kwargsrepr, written into the holder entry by the worker).
        held = f"{CALL_API_PATIENT} ('{token}',) {{'hold': True}}"
        wait_until(lambda: node_texts(driver, f"tr.key-row{of_key} td.held") == [held],
                   timeout=15, interval=0.1, what="the table to show the holder's arguments")
        click(driver, By.CSS_SELECTOR, f"tr.key-row{of_key}")  # opens its details
        wait_until(lambda: texts(driver, f"{row} tr.holder .task-id") == [first.id],
                   timeout=15, interval=0.1, what="the page to show the first run holding")
        # A parked run is a message in the broker: the page counts it, by no task id.
        wait_until(lambda: "parked line (1)" in [text.lower() for text in
                                                 texts(driver, f"{row} h3") or []],
                   timeout=15, interval=0.1, what="the page to show the second run parked")
        wait_until(lambda: any(name in text and "1/1" in text
                               for text in texts(driver, f"tr.key-row{of_key}") or []),
                   timeout=15, interval=0.1, what="the key's row to show 1/1 slots used")

        records.set(f"go:{token}", 1)  # the first run ends and frees the slot ...
        assert first.get(timeout=30) == first.id
        records.delete(f"go:{token}")  # ... and the second, handed it, holds it
        wait_until(lambda: texts(driver, f"{row} tr.holder .task-id") == [second.id]
                   or second.ready(), timeout=30, interval=0.1,
                   what="the page to show the second run holding the freed slot")
        records.set(f"go:{token}", 1)  # (if it started before the delete, it has ended)
        assert second.get(timeout=30) == second.id
        wait_until(lambda: texts(driver, f"{row} tr.holder") == [],
                   timeout=15, interval=0.1, what="the page to show no holder")
        urls = requested_urls(driver)
        assert any(url.endswith("/api/state") for url in urls)
        assert urls and all(url.startswith(web.base) for url in urls), urls
    finally:
        driver.quit()
        web.stop()
    assert "Traceback" not in web.output(), web.output()


def test_screenshot_file_is_committed():
    image = Path(__file__).resolve().parent.parent / "docs" / "images" / "web_dashboard.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_control_release_frees_one_holder_by_token_or_unique_start(app, lock_client, held):
    from celery_redislock.admin.control import LimitControlError, release_holder

    other = admit(lock_client, [SlotLimit(CRAWL, 2, "redislock:")], lease=30,
                  owner="w1@host|task-2|", description=DESCRIPTION)
    assert other.fence
    with pytest.raises(LimitControlError, match="ambiguous"):
        release_holder(app, CRAWL, "w1@host|task-")
    with pytest.raises(LimitControlError, match="no holder"):
        release_holder(app, CRAWL, "w9@host")
    freed = release_holder(app, CRAWL, "w1@host|task-2")
    assert freed.token.startswith("w1@host|task-2|")
    assert [h.token for h in limit_state(app, CRAWL).holders] == [held.token]


FORGED = """<!DOCTYPE html><html><body>
<form id="form" method="POST" action="{action}" enctype="text/plain">
<input name='{{"action": "pause", "key": "{key}", "seconds": 60, "x": "' value='"}}'>
</form>
<script>
fetch("{action}", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
  body: JSON.stringify({{action: "set-slots", key: "{key}", slots: 9}})}})
  .finally(() => fetch("{action}", {{method: "POST", headers: {{"Content-Type":
    "application/json", "X-Redislock-Token": "{token}"}},
    body: JSON.stringify({{action: "set-slots", key: "{key}", slots: 7}})}})
  .catch(() => null).finally(() => document.getElementById("form").submit()));
</script></body></html>"""


def test_page_actions_need_the_token_and_forged_cross_site_posts_change_nothing(
        app, held, executables):
    """In a real browser: a page of another site that posts a form, a no-cors fetch and
    a fetch with the token at the dashboard changes nothing; the dashboard's own page,
    once given the token, pauses a key."""
    from selenium.webdriver.common.by import By

    served = serve(app, token=TOKEN)
    key = semaphore_key(CRAWL)
    forger = PageServer(FORGED.format(action=served.base + "api/action", key=key,
                                      token=TOKEN))
    driver = browser(executables)
    try:
        driver.get(forger.base)
        wait_until(lambda: "refused" in driver.page_source or "JSON body" in
                   driver.page_source, timeout=15, interval=0.1,
                   what="the forged form to be answered")
        state = limit_state(app, CRAWL)
        assert not state.paused and state.limit == 2 and state.slots_override is None

        driver.get(served.base)
        row = f'tr.key-row[data-key="{key}"]'
        click(driver, By.CSS_SELECTOR, row)
        pause_button = '//tr[contains(@class, "detail")]//button[text()="Pause…"]'
        click(driver, By.XPATH, pause_button)  # no token typed yet
        driver.switch_to.alert.send_keys("60")
        driver.switch_to.alert.accept()
        wait_until(lambda: "X-Redislock-Token" in "".join(texts(driver, "#notice") or []),
                   timeout=15, interval=0.1, what="the page to report the refusal")
        assert not limit_state(app, CRAWL).paused

        driver.find_element(By.ID, "token").send_keys(TOKEN)
        click(driver, By.XPATH, pause_button)
        driver.switch_to.alert.send_keys("60")
        driver.switch_to.alert.accept()
        wait_until(lambda: limit_state(app, CRAWL).paused, timeout=15, interval=0.1,
                   what="the page's pause to reach the lock store")
        wait_until(lambda: "left" in "".join(texts(driver, row) or []),
                   timeout=15, interval=0.1, what="the page to show the pause")
    finally:
        driver.quit()
        forger.stop()
        served.stop()


# --- what the table shows without a click, and when the store cannot be read ---------

#: Arguments of a run as its caller wrote them: text that must stay text on the page.
EVIL_ARGS = "('<img src=x onerror=\"window.pwned=1\">', 42) {'full': True}"


def node_texts(driver, css):
    """The textContent of every element ``css`` selects (SVG text too), or None when
    the page redrew them meanwhile."""
    try:
        return driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), n => n.textContent)",
            css)
    except Exception:  # a redraw between the query and the read
        return None


def test_table_shows_who_holds_overrides_and_scale_and_hides_idle_keys(
        app, lock_client, executables):
    """Without a click: the holder's task and arguments (put as text: the markup in them
    is shown, never run), the set-slots override beside the usage, the history's scale;
    an idle key (0/1, nobody waiting) is not listed."""
    from celery_redislock.admin.control import set_slots

    description = json.dumps({"task": CRAWL, "worker": "w1@host", "pid": 1, "id": "task-9",
                              "args": EVIL_ARGS})
    assert admit(lock_client, [SlotLimit(CRAWL, 2, "redislock:")], lease=30,
                 owner="w1@host|task-9|", description=description).fence
    idle = Semaphore(lock_client, "idle", slots=1)
    lease = idle.acquire()
    assert lease is not None and lease.release()
    assert limit_state(app, "idle").exists  # in Redis, at 0/1
    set_slots(app, CRAWL, 5)
    served = serve(app)
    driver = browser(executables)
    try:
        driver.get(served.base)
        row = f'tr.key-row[data-key="{semaphore_key(CRAWL)}"]'
        wait_until(lambda: (node_texts(driver, f"{row} td.held") or [""])[0].startswith(CRAWL),
                   timeout=15, interval=0.1, what="the table to show who holds the key")
        held = node_texts(driver, f"{row} td.held")[0]
        assert held.startswith(f"{CRAWL} {EVIL_ARGS[:30]}") and held.endswith("…"), held
        full = driver.execute_script(
            "return document.querySelector(arguments[0]).title", f"{row} .held-by")
        assert full == f"{CRAWL} {EVIL_ARGS}", full  # the whole text, on hover
        assert driver.find_elements("css selector", "#keys img") == []
        assert driver.execute_script("return window.pwned") is None
        assert "override 5 (was 2)" in node_texts(driver, row)[0]
        assert node_texts(driver, "tr.key-row .key-name") == ["▸" + CRAWL]  # no "idle"
        wait_until(lambda: node_texts(driver, f"{row} svg.spark text.spark-max") == ["5"],
                   timeout=15, interval=0.1, what="the history chart's scale (its top: 5)")
        assert "top is 5" in node_texts(driver, f"{row} svg.spark title")[0]
    finally:
        driver.quit()
        served.stop()


def test_page_says_when_the_store_cannot_be_read(closed_port, executables, tmp_path):
    """A store down from the start: the table says so instead of "Loading…"; a store lost
    after a read: the last read stays, marked as not live, with its time."""
    from redis_process import RedisServer

    down = serve(create_cli_app(f"redis://127.0.0.1:{closed_port}/0"))
    store = RedisServer().start()
    lost_app = create_cli_app(store.url)
    assert admit(store.client(), [SlotLimit(CRAWL, 2, "redislock:")], lease=60,
                 owner="w1@host|task-1|", description=DESCRIPTION).fence
    lost = serve(lost_app)
    driver = browser(executables)
    try:
        driver.get(down.base)
        wait_until(lambda: "cannot be read" in "".join(node_texts(driver, "#keys") or []),
                   timeout=15, interval=0.1, what="the table to say the store is down")
        text = node_texts(driver, "#keys")[0]
        assert "Loading" not in text and "Trying again every" in text, text
        assert node_texts(driver, "#total-keys") == ["?"]

        driver.get(lost.base)
        wait_until(lambda: node_texts(driver, "tr.key-row .key-name") == ["▸" + CRAWL],
                   timeout=15, interval=0.1, what="the page to show the key")
        store.stop()
        wait_until(lambda: "Not live" in "".join(node_texts(driver, "#keys") or []),
                   timeout=20, interval=0.1, what="the page to mark the last read stale")
        assert node_texts(driver, "tr.key-row .key-name") == ["▸" + CRAWL]
        assert "the last read, at 20" in node_texts(driver, "tr.stale-note")[0]
    finally:
        driver.quit()
        down.stop()
        lost.stop()
        store.stop()
