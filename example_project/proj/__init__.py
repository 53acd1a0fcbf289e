"""A small Celery project whose tasks are limited by celery-redislock.

``proj.app`` holds the Celery app (configured from environment variables),
``proj.tasks`` the limited tasks, and ``proj.records`` the bookkeeping the tasks do so
that the demo can check, afterwards, how many of them ran at once.
"""
