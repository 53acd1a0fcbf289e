"""Benchmarks of celery-redislock against a private redis-server (see README.md)."""
