"""The step link between process 0 and its followers, over socket pairs (no JAX runtime): calls are replayed
in order with their arguments, stop ends a follower, and a follower that exits or goes silent, or a leader
that exits, is noticed. The two-process serve test (tests/e2e/test_multihost.py) runs the same code for real."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from jaxchat.engine import step_link
from jaxchat.engine.sampler import SamplingArrays
from jaxchat.engine.step_link import BroadcastRunner, ClusterLost, FollowerLink, LeaderLink, follow


class RecordingRunner:
    max_context = 64

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list = []
        self.fail_on = fail_on

    def _record(self, name, *args, **kwargs):
        self.calls.append((name, args, kwargs))
        if name == self.fail_on:
            raise RuntimeError(f"{name} failed")
        return name

    def decode(self, *a, **k):
        return self._record("decode", *a, **k)

    def prefill(self, *a, **k):
        return self._record("prefill", *a, **k)

    def prefill_rows(self, *a, **k):
        return self._record("prefill_rows", *a, **k)

    def mixed(self, *a, **k):
        return self._record("mixed", *a, **k)

    def extend(self, *a, **k):
        return self._record("extend", *a, **k)

    def move(self, *a, **k):
        return self._record("move", *a, **k)

    def swap(self, *a, **k):
        return self._record("swap", *a, **k)


def linked(on_lost=None, on_leader_lost=None):
    lead_end, follow_end = socket.socketpair()
    return LeaderLink({1: lead_end}, on_lost), FollowerLink(follow_end, on_leader_lost or (lambda reason: None))


def same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def test_the_follower_replays_every_step_call_in_order_until_stop():
    leader, follower = linked()
    runner, replica = RecordingRunner(), RecordingRunner()
    broadcast = BroadcastRunner(runner, leader)
    sp = SamplingArrays.numpy(2)
    assert broadcast.decode(np.array([5, 6], np.int32), np.array([3, -1], np.int32), np.zeros((2, 9), np.int32), sp) == "decode"
    broadcast.prefill(1, [1, 2, 3], np.zeros((1, 9), np.int32), SamplingArrays.numpy(1), start=1, prompt_len=2)
    broadcast.prefill_rows(2, [([1, 2, 3], 0, 3), ([1, 2, 4, 5], 2, 3)], np.zeros((2, 9), np.int32),
                           SamplingArrays.numpy(2))
    broadcast.mixed(np.array([5, 6], np.int32), np.array([3, -1], np.int32), [(1, [4, 5, 6], 0, [4, 5, 6], 3, True)],
                    np.zeros((3, 9), np.int32), SamplingArrays.numpy(3), shape=(1, 8))
    broadcast.extend(0, [7, 8], 4, np.ones((1, 9), np.int32), SamplingArrays.numpy(1))
    broadcast.move(2, 0)
    broadcast.swap(0, 1)
    assert broadcast.max_context == 64  # anything else is the runner's own
    leader.stop()
    done = threading.Thread(target=follow, args=(replica, follower))
    done.start()
    done.join(timeout=10)
    assert not done.is_alive()
    assert [c[0] for c in replica.calls] == ["decode", "prefill", "prefill_rows", "mixed", "extend", "move", "swap"]
    assert same(replica.calls, runner.calls)


def test_a_follower_that_exits_is_lost_at_once_and_later_steps_raise():
    lost = []
    leader, follower = linked(on_lost=lost.append)
    follower._sock.shutdown(socket.SHUT_RDWR)  # as the kernel does for a process that exits
    assert leader.wait_lost(5) and "connection closed" in lost[0]
    with pytest.raises(ClusterLost):
        BroadcastRunner(RecordingRunner(), leader).decode(np.zeros(1, np.int32))


def test_a_silent_follower_is_lost_after_the_heartbeat_timeout(monkeypatch):
    monkeypatch.setattr(step_link, "LOST_AFTER_S", 0.5)
    lost = []
    lead_end, silent = socket.socketpair()  # connected, never sends a heartbeat
    leader = LeaderLink({1: lead_end}, lost.append)
    t0 = time.monotonic()
    assert leader.wait_lost(5)
    assert 0.4 < time.monotonic() - t0 < 3 and "stopped answering" in lost[0]
    silent.close()


def test_a_step_that_fails_because_a_follower_died_raises_cluster_lost():
    leader, follower = linked()
    broadcast = BroadcastRunner(RecordingRunner(fail_on="decode"), leader)
    threading.Timer(0.2, follower._sock.shutdown, args=(socket.SHUT_RDWR,)).start()
    with pytest.raises(ClusterLost):
        broadcast.decode(np.zeros(1, np.int32))


def test_the_follower_notices_when_process_0_is_gone():
    gone = threading.Event()
    leader, follower = linked(on_leader_lost=lambda reason: gone.set())
    leader._stopping = True
    for sock in leader._sockets.values():
        sock.shutdown(socket.SHUT_RDWR)
    assert gone.wait(5)
