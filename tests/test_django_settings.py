"""The Django section of ``docs/configuration.md`` is true: its ``settings.py`` snippet,
loaded as a Django project loads Celery's settings (``namespace="CELERY"``), gives the
package its lock store, its limits and its signing key, and ``install(app)`` where the
section puts it (after ``autodiscover_tasks()``) limits a plain shared task. (Django
itself is not needed: ``config_from_object`` reads any object's upper-case names.)"""

from __future__ import annotations

import re
import types
from pathlib import Path

from celery import Celery

from celery_redislock import check_limits, install
from celery_redislock.config.settings import read_settings

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def django_snippet(first_line: str) -> str:
    section = DOC.read_text().split("\n## Django\n", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return next(block for block in blocks if block.startswith(first_line))


def test_the_documented_django_settings_reach_the_package(monkeypatch):
    monkeypatch.setenv("REDISLOCK_SIGNING_KEY", "k" * 32)
    settings = types.ModuleType("settings")
    exec("import os\n" + django_snippet("# proj/settings.py"), settings.__dict__)
    assert "install(app)" in django_snippet("# proj/celery.py")

    app = Celery("proj", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")

    @app.task(name="shop.tasks.sync_orders", shared=False)
    def sync_orders(shop_id):
        return shop_id

    install(app)  # as proj/celery.py does, after the settings and autodiscover_tasks()
    check_limits(app)
    found = read_settings(app)
    assert found.url == settings.CELERY_REDISLOCK_URL
    assert found.signing_key is not None
    assert app.tasks["shop.tasks.sync_orders"]._redislock_wrapped
