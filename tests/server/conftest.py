"""Fixtures: the fake service, the app on an in-process transport, and a live uvicorn on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from typing import Self

import pytest
from starlette.testclient import TestClient

from jaxchat.api import Limits
from jaxchat.server import create_app
from jaxchat.server.run import make_server
from tests.server.fake import FakeService

API_KEY = "sk-test-key"


class Live:
    def __init__(self, service, api_key=None, limits=None) -> None:
        self.service = service
        self.app = create_app(service, api_key=api_key, limits=limits)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(service, port=self.port, log_level="warning", app=self.app, limits=limits)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the live server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def service() -> FakeService:
    return FakeService()


@pytest.fixture
def client(service):
    app = create_app(service)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def keyed_client(service):
    app = create_app(service, api_key=API_KEY)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def live():
    with Live(FakeService()) as server:
        yield server


@pytest.fixture(scope="module")
def live_keyed():
    with Live(FakeService(), api_key=API_KEY, limits=Limits(max_body_bytes=64 * 1024)) as server:
        yield server
