"""Helpers of the dashboard tests (``test_web.py``): serve it, ask it over HTTP, and
drive a real headless chromium at it.

* :class:`Served`: the dashboard's app served by uvicorn in a thread of the test.
* :class:`WebCommand`: the real ``celery -A <module> redislock web`` in a subprocess.
* :func:`chromium` / :func:`browser`: the system's chromium and chromedriver (Debian's
  ``chromium`` and ``chromium-driver``), driven by selenium, with the DevTools
  performance log on so a test can list every request the page made.
* :func:`dashboard_in_chromium` / :func:`shown`: a Celery app's dashboard served and
  open in that chromium; the texts a selector finds on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from redis_process import START_ATTEMPTS, free_port
from support import wait_until

TESTS = Path(__file__).resolve().parent


def request(url: str, *, method: str = "GET", body: Optional[bytes] = None,
            headers: Optional[Mapping[str, str]] = None,
            timeout: float = 10.0) -> Tuple[int, Dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one HTTP request; errors too."""
    ask = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(ask, timeout=timeout) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, \
                answer.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def get_json(url: str) -> Any:
    status, _, body = request(url)
    assert status == 200, (status, body)
    return json.loads(body)


class Served:
    """``app`` served on 127.0.0.1 by uvicorn in a daemon thread, until :meth:`stop`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._serve_on(free_port())

    def _serve_on(self, port: int) -> None:
        import uvicorn

        self.port = port
        self.base = f"http://127.0.0.1:{self.port}/"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Served:
        """Serve, and wait until uvicorn listens; on a fresh port while the port was
        taken (by another test process) before uvicorn could bind it."""
        for attempt in range(1, START_ATTEMPTS + 1):
            self.thread.start()
            wait_until(lambda: self.server.started or not self.thread.is_alive(), timeout=15,
                       what="uvicorn to start")
            if self.server.started or attempt == START_ATTEMPTS or not taken(self.port):
                break
            self._serve_on(free_port())
        assert self.server.started, "uvicorn did not start"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class WebCommand:
    """``celery -A <module> redislock web --port <free port> <args>`` in a subprocess,
    with ``env``; its output goes to ``log``."""

    def __init__(self, module: str, env: Mapping[str, str], log: Path, *args: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}/"
        self.command = [sys.executable, "-m", "celery", "-A", module, "redislock", "web",
                        "--port", str(self.port), *args]
        self.env = dict(env)
        self.log = log
        self.process: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 30.0) -> WebCommand:
        """Start the command, and wait until the dashboard answers; on a fresh port while
        the port was taken (by another test process) before the command could bind it."""
        for attempt in range(1, START_ATTEMPTS + 1):
            with open(self.log, "wb") as out:
                self.process = subprocess.Popen(self.command, env=self.env, cwd=TESTS,
                                                stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL)
            wait_until(self._up_or_exited, timeout=timeout, interval=0.1,
                       what="the dashboard to answer")
            if self.process.poll() is None:
                return self
            if attempt == START_ATTEMPTS or "address already in use" not in self.output():
                raise AssertionError(f"the dashboard exited at start:\n{self.output()}")
            self.port = free_port()
            self.base = f"http://127.0.0.1:{self.port}/"
            self.command[self.command.index("--port") + 1] = str(self.port)
        raise AssertionError("unreachable")

    def _up_or_exited(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            return True  # exited: the caller says why
        try:
            return request(self.base + "api/state", timeout=2)[0] == 200
        except OSError:
            return False

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def taken(port: int) -> bool:
    """Whether another socket holds ``port`` of 127.0.0.1 (this one cannot bind it)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def chromium() -> Optional[Tuple[str, str]]:
    """(browser, driver) executables of the system's chromium, or None when absent."""
    browser = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                    if (found := shutil.which(name))), None)
    driver = shutil.which("chromedriver") or next(
        (path for path in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
         if os.access(path, os.X_OK)), None)
    return (browser, driver) if browser and driver else None


def browser(executables: Tuple[str, str], width: int = 1280, height: int = 900) -> Any:
    """A headless chromium driven by selenium, with its performance log (DevTools
    network events) recorded; the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = executables[0]
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--disable-extensions", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-default-apps", "--hide-scrollbars",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=executables[1]))


@contextlib.contextmanager
def dashboard_in_chromium(app: Any) -> Iterator[Any]:
    """A headless chromium at the dashboard of Celery app ``app`` (its lock store, read
    afresh at every refresh, 5 samples of history), served in this test; yields the
    selenium driver, the page loaded. Skips the test when chromium is absent.

        with dashboard_in_chromium(app) as driver:
            click(driver, "css selector", 'tr.key-row[data-key="..."]')
    """
    import pytest

    from celery_redislock.admin.cli import LockStore
    from celery_redislock.web.app import create_app
    from celery_redislock.web.state import Dashboard

    executables = chromium()
    if executables is None:
        pytest.skip("no chromium and chromedriver on PATH")
    served = Served(create_app(Dashboard(LockStore(app), min_interval=0, history=5))).start()
    try:
        driver = browser(executables)
        try:
            driver.get(served.base)
            yield driver
        finally:
            driver.quit()
    finally:
        served.stop()


def shown(driver: Any, css: str) -> List[str]:
    """The ``textContent`` of every element ``css`` selects, read in one script; [] when
    the page redrew them between the query and the read."""
    try:
        return list(driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), "
            "n => n.textContent)", css))
    except Exception:  # a redraw between the query and the read
        return []


def requested_urls(driver: Any) -> List[str]:
    """Every URL the page asked for since the last call (DevTools ``requestWillBeSent``)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


class PageServer:
    """Serves one HTML page on another origin (``http://localhost:<port>/``): the
    forger's site of the cross-site tests. Stop it with :meth:`stop`."""

    def __init__(self, html: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        body = html.encode()

        class Page(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
        self.base = f"http://localhost:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def texts(driver: Any, css: str) -> Optional[List[str]]:
    """The text of every element ``css`` selects, or None when the page redrew them
    while they were read (the page replaces its rows on every refresh)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return [element.text for element in driver.find_elements(By.CSS_SELECTOR, css)]
    except StaleElementReferenceException:
        return None


def click(driver: Any, by: str, selector: str, timeout: float = 15.0) -> None:
    """Click the element ``selector`` finds, once it exists and was not redrawn meanwhile."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
    )

    def clicked() -> bool:
        try:
            driver.find_element(by, selector).click()
            return True
        except (NoSuchElementException, StaleElementReferenceException):
            return False

    wait_until(clicked, timeout=timeout, interval=0.05, what=f"to click {selector}")
