"""The lock store behind a password, an ACL user, and TLS (``rediss://``)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from celery import Celery

from celery_redislock import LimitedTask, Semaphore
from celery_redislock.config.settings import redis_client

from redis_process import AddressInUse, RedisServer, free_port, started


def app_on(url, **conf):
    app = Celery("secured", set_as_current=False)
    app.conf.redislock_url = url
    app.conf.update(conf)

    @app.task(base=LimitedTask, lock_key="secured", bind=True, shared=False)
    def guarded(self):
        return self.request.redislock_lease.fence > 0

    return app, guarded


@pytest.fixture(scope="module")
def acl_server():
    server = RedisServer(extra_args=["--requirepass", "topsecret"]).start()
    admin = server.client(password="topsecret")
    admin.execute_command("ACL", "SETUSER", "locks", "on", ">lockpass", "~redislock:*",
                          "+@all")
    yield server
    server.cleanup()


def test_password_in_the_url(acl_server):
    _app, guarded = app_on(f"redis://:topsecret@127.0.0.1:{acl_server.port}/0")
    assert guarded.apply().get() is True


def test_acl_user_limited_to_the_package_keys(acl_server):
    app, guarded = app_on(f"redis://locks:lockpass@127.0.0.1:{acl_server.port}/0")
    assert guarded.apply().get() is True
    client = redis_client(app)
    sem = Semaphore(client, "acl", slots=1)
    assert sem.release(sem.acquire(blocking=False))


@pytest.fixture(scope="module")
def tls_server():
    if not shutil.which("openssl"):
        pytest.skip("no openssl to make a test certificate")
    directory = Path(tempfile.mkdtemp(prefix="redislock-tls-"))
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(directory / "key.pem"),
         "-out", str(directory / "cert.pem")],
        check=True, capture_output=True,
    )
    tls_ports = []

    def on_fresh_ports():
        tls_ports.append(free_port())
        return RedisServer(extra_args=[
            "--tls-port", str(tls_ports[-1]), "--tls-cert-file", str(directory / "cert.pem"),
            "--tls-key-file", str(directory / "key.pem"),
            "--tls-ca-cert-file", str(directory / "cert.pem"), "--tls-auth-clients", "no",
        ])

    try:
        server = started(on_fresh_ports)
    except AddressInUse:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    except RuntimeError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.skip(f"this redis-server has no TLS: {exc}")
    yield tls_ports[-1], directory / "cert.pem"
    server.cleanup()
    shutil.rmtree(directory, ignore_errors=True)


def test_tls_lock_store(tls_server):
    port, ca = tls_server
    app, guarded = app_on(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}"
                          "&ssl_check_hostname=false")
    assert guarded.apply().get() is True
    client = redis_client(app)
    assert client.connection_pool.connection_class.__name__ == "SSLConnection"
