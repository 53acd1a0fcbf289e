"""Take the dashboard's screenshot for the docs, with real data: real workers run the
limited tasks of ``web_demo_app`` while the real ``celery redislock web`` serves the page
and a headless chromium photographs it.

    python tests/web_screenshot.py docs/images/web_dashboard.png
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

from selenium.webdriver.common.by import By

from celery_redislock.admin.control import pause, set_slots

from web_demo_app import REBUILD, RENDER, SYNC, create_worker_app
from web_support import WebCommand, browser, chromium
from worker_cluster import WorkerCluster

SYNC_KEY = "crm:acme"


def main(target: Path) -> None:
    executables = chromium()
    if executables is None:
        raise SystemExit("no chromium and chromedriver: apt-get install chromium chromium-driver")
    random.seed(7)
    logs = Path(tempfile.mkdtemp(prefix="web-screenshot-"))
    with WorkerCluster(logs, app_module="web_demo_app", app_factory=create_worker_app,
                       workers=2, concurrency=6) as cluster:
        app = cluster.app
        web = WebCommand("web_demo_app", cluster._worker_environment(cluster.urls),
                         logs / "web.log", "--interval", "1").start()
        try:
            pause(app, "crm:globex", seconds=900)
            set_slots(app, "crm:initech", 3)
            driver = browser(executables, width=1360, height=1180)
            driver.get(web.base)
            for second in range(45):
                for _ in range(1 if second % 5 else 0):
                    app.send_task(RENDER, (random.uniform(4, 8),))
                if second % 2 == 0:
                    app.send_task(SYNC, (SYNC_KEY.split(":")[1], random.uniform(4, 8)))
                if second % 4 == 1:
                    app.send_task(SYNC, (random.choice(["initech", "globex"]),
                                         random.uniform(2, 5)))
                if second in (0, 25):
                    app.send_task(REBUILD, (30.0,))
                if second == 43:
                    for name in (RENDER, SYNC_KEY):
                        driver.find_element(
                            By.CSS_SELECTOR, f'tr.key-row[data-key$=":{name}"]').click()
                time.sleep(1)
            target.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(target))
            driver.quit()
        finally:
            web.stop()
    print(f"wrote {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images/web_dashboard.png"))
