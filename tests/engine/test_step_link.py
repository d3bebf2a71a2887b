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
from jaxchat.engine.plan import RowInput, SamplingRow
from jaxchat.engine.step_link import BroadcastRunner, ClusterLost, FollowerLink, LeaderLink, follow


class RecordingRunner:
    max_context = 64
    max_step_tokens, max_step_rows, max_verify_tokens, ragged_rows = 256, 4, 16, (4,)

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list = []
        self.fail_on = fail_on

    def _record(self, name, *args, **kwargs):
        self.calls.append((name, args, kwargs))
        if name == self.fail_on:
            raise RuntimeError(f"{name} failed")
        return name

    def run(self, *a, **k):
        return self._record("run", *a, **k)


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
    mask = np.full(9, -1, np.int32)
    values = SamplingRow(seed=7)
    steps = [
        [RowInput(0, [1, 2, 3], 0, [4], True, 3, 3, True, mask, values)],
        [RowInput(0, [9], 3, [4], False, 3, 4, True, mask, values),
         RowInput(2, [5, 6, 7, 8, 9], 16, [1, 2, 8, 3, 5, 6], False, 2, 17, False, np.zeros(9, np.int32), values)],
    ]
    for rows in steps:
        assert broadcast.run(rows) == "run"
    assert broadcast.runner is runner  # what the core reads besides the step calls is the runner's own
    assert (broadcast.max_step_tokens, broadcast.max_step_rows, broadcast.max_verify_tokens,
            broadcast.ragged_rows) == (256, 4, 16, (4,))
    leader.stop()
    done = threading.Thread(target=follow, args=(replica, follower))
    done.start()
    done.join(timeout=60)
    assert not done.is_alive()
    assert [c[0] for c in replica.calls] == ["run", "run"]
    assert same(replica.calls, runner.calls)


def test_a_follower_that_exits_is_lost_at_once_and_later_steps_raise():
    lost = []
    leader, follower = linked(on_lost=lost.append)
    follower._sock.shutdown(socket.SHUT_RDWR)  # as the kernel does for a process that exits
    assert leader.wait_lost(60) and "connection closed" in lost[0]
    with pytest.raises(ClusterLost):
        BroadcastRunner(RecordingRunner(), leader).run([])


def test_a_silent_follower_is_lost_after_the_heartbeat_timeout(monkeypatch):
    monkeypatch.setattr(step_link, "LOST_AFTER_S", 0.5)
    lost = []
    lead_end, silent = socket.socketpair()  # connected, never sends a heartbeat
    t0 = time.monotonic()  # before the link exists: its timeout cannot have started earlier
    leader = LeaderLink({1: lead_end}, lost.append)
    assert leader.wait_lost(60)  # a guard against a hang, not a bound: only the lower bound is asserted
    # not before the timeout (a load can only make it later), and by the timeout, not a closed connection
    assert time.monotonic() - t0 >= 0.5 and "stopped answering" in lost[0]
    silent.close()


def test_a_step_that_fails_because_a_follower_died_raises_cluster_lost():
    leader, follower = linked()
    broadcast = BroadcastRunner(RecordingRunner(fail_on="run"), leader)
    threading.Timer(0.2, follower._sock.shutdown, args=(socket.SHUT_RDWR,)).start()
    with pytest.raises(ClusterLost):
        broadcast.run([])


def test_the_follower_notices_when_process_0_is_gone():
    gone = threading.Event()
    leader, follower = linked(on_leader_lost=lambda reason: gone.set())
    leader._stopping = True
    for sock in leader._sockets.values():
        sock.shutdown(socket.SHUT_RDWR)
    assert gone.wait(60)


def test_process_0_waits_until_every_follower_has_adopted_a_program():
    """A follower reports each background program it adopts; the leader's `wait_ready` returns once every
    follower has it (so process 0 adopts it only then), and False once the link is stopping (never adopted)."""
    leader, follower = linked()
    key = ("decode", 0, 2)
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(leader.wait_ready(key)))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive() and not waited  # the follower has not reported it yet
    follower.report_ready(("decode", 0, 1))  # another program: still waiting
    time.sleep(0.3)
    assert waiter.is_alive()
    follower.report_ready(key)
    waiter.join(timeout=10)
    assert waited == [True]
    assert leader.wait_ready(("decode", 0, 1)) is True  # reported earlier: at once
    leader.stop()
    assert leader.wait_ready(("ragged", 64, 4)) is False  # stopping: never adopted
