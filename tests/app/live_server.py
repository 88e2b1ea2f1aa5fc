"""A real uvicorn server in a background thread, for clients that need a URL (CLI, fuzzing)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from app.main import create_app
from core.settings import Settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def live_server(settings: Settings, *, keep_alive_s: int = 5) -> Iterator[str]:
    """Serve create_app(settings) on a free loopback port; yields the base URL. Idle keep-alive
    connections are closed after `keep_alive_s` (uvicorn's default: 5)."""
    port = free_port()
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        timeout_keep_alive=keep_alive_s,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("live server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
