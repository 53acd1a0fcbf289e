"""``celery redislock web``: a small live dashboard of an app's limits, for operators.

A page (and the same state as JSON at ``/api/state``) that shows every key with its
slots used out of its limit, its waiting runs, its rate, a short history, its holders
and its parked line. Read-only unless started with ``--allow-actions`` and a token.
Needs the ``web`` extra (``pip install 'celery-redislock[web]'``)::

    celery -A proj redislock web --port 8000
    REDISLOCK_WEB_TOKEN=$(openssl rand -hex 16) \\
        celery -A proj redislock web --allow-actions

The command is added to the ``celery redislock`` group by :func:`add_web_command`;
nothing here imports the server library until the command runs.
"""

from __future__ import annotations

from .command import add_web_command

__all__ = ["add_web_command"]
