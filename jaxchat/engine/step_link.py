"""One step, many controllers: process 0's step calls replayed by every other process, and fault detection.

JAX's multi-controller runtime needs every process to run the same programs on the same global arrays in the
same order. Process 0 (the leader) owns the scheduler, grammar matchers and parser; each step call it makes
on its `StepRunner` (`launch`, `sample` and `run`: the calls that run device programs after warm-up) is first sent, with its
host arguments, to every follower, which makes the same call on its own runner. The programs' outputs are replicated, so every process computes the same tokens; only the leader
reads them.

Contract:
- `LeaderLink.open(followers, signature, on_lost, timeout_s)` listens on process 0's coordinator host (an
  ephemeral port, published with a random token through the coordination service's key-value store) and
  waits for every follower's hello; a follower whose runner `signature` (buckets, sizes, layout: what decides
  the programs) differs from the leader's is refused and the leader raises `ValueError` naming both.
  `FollowerLink.connect(process_id, signature, timeout_s)` is the other end.
- `BroadcastRunner(runner, link)` is the leader's runner as the engine core drives it (`Engine.relay_steps`
  installs it in the core; the engine keeps the runner itself): every step call is sent first, then run; `fetch`,
  `release` and the step limits are the runner's. `follow(runner, link)` is a follower's whole life: it replays calls until the
  leader says stop (returns) or is gone (exits the process with status 1).
- Faults. Followers send a heartbeat every `HEARTBEAT_S`; a follower whose connection closes (the process died)
  or that sends nothing for `LOST_AFTER_S` (it hangs) is lost: the leader calls `on_lost(reason)` once, from
  its monitor thread, and every later step call raises `ClusterLost`. A step that fails while the link is, or
  within `LOST_AFTER_S` becomes, lost raises `ClusterLost` too (a collective whose peer died). A follower
  exits with status 1 as soon as the leader's connection closes, even in the middle of a step.
- Programs compiled in the background (`Engine.compile_rest`): a follower reports each it adopts
  (`FollowerLink.report_ready(key)`, on its heartbeat connection); `LeaderLink.wait_ready(key)` returns once every
  follower has (False if the cluster is lost or stopping), and only then does process 0 adopt it, so no step
  names a program a follower lacks.
- `LeaderLink.stop()` tells the followers to finish (their `follow` returns) and closes the link.
Frames are 8-byte big-endian lengths and pickles; only the processes of one `jax.distributed` runtime, holding
the token, connect.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import queue
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable

from jaxchat.engine import cluster

log = logging.getLogger(__name__)

STEP_CALLS = ("run", "launch", "sample")
LINK_KEY = "jaxchat/step_link"
HEARTBEAT_S = 1.0
LOST_AFTER_S = 10.0
_STOP = ("stop", (), {})


class ClusterLost(RuntimeError):
    """A process of the cluster is gone: no step can run any more."""


def runner_signature(runner) -> str:
    """What decides a runner's programs and state: equal on every process, or their steps would differ."""
    return json.dumps({
        "max_batch": runner.max_batch, "max_context": runner.max_context, "vocab": runner.vocab_size,
        "valid_vocab": runner.valid_vocab, "layout": runner.layout, "num_pages": runner.num_pages,
        "page_size": runner.page_size, "backend": repr(runner.backend), "programs": [list(k) for k in
                                                                                   runner.program_keys()],
    }, sort_keys=True)


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack("!Q", len(payload)) + payload)


def _recv_frame(sock: socket.socket) -> bytes | None:
    """One frame's payload, or None when the peer closed the connection."""
    head = _recv_exact(sock, 8)
    return None if head is None else _recv_exact(sock, struct.unpack("!Q", head)[0])


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class LeaderLink:
    def __init__(self, sockets: dict[int, socket.socket], on_lost: Callable[[str], None] | None) -> None:
        self._sockets = sockets
        self._on_lost = on_lost
        self._send_lock = threading.Lock()
        self._lost_lock = threading.Lock()  # not the send lock: a send may block on a follower that hangs
        self._lost = threading.Event()
        self.lost_reason: str | None = None
        self._stopping = False
        self._ready: dict[int, set] = {pid: set() for pid in sockets}  # the programs each follower has adopted
        self._ready_changed = threading.Condition()
        for pid, sock in sockets.items():
            threading.Thread(target=self._monitor, args=(pid, sock), name=f"jaxchat-link-{pid}", daemon=True).start()

    @classmethod
    def open(cls, followers: int, signature: str, on_lost: Callable[[str], None] | None = None,
             timeout_s: float = 3600.0) -> LeaderLink:
        host = cluster.coordinator_host()
        server = socket.create_server((host, 0))
        token = secrets.token_hex(16)
        cluster.publish(LINK_KEY, json.dumps({"host": host, "port": server.getsockname()[1], "token": token}))
        log.info("Waiting for %d follower process(es) on %s:%d", followers, host, server.getsockname()[1])
        sockets: dict[int, socket.socket] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(sockets) < followers:
                server.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    missing = followers - len(sockets)
                    raise TimeoutError(f"{missing} follower process(es) did not connect in {timeout_s:.0f} s") from None
                sock.settimeout(30)
                hello = _recv_frame(sock)
                info = json.loads(hello) if hello else {}
                if info.get("token") != token:
                    sock.close()
                    continue
                if info.get("signature") != signature:
                    _send_frame(sock, pickle.dumps(_STOP))
                    raise ValueError(f"process {info.get('process')} runs different step programs than process 0: "
                                     f"{info.get('signature')} vs {signature} (start every process with the same "
                                     "model and settings)")
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sockets[int(info["process"])] = sock
        except BaseException:
            for sock in sockets.values():
                sock.close()
            raise
        finally:
            server.close()
        log.info("All %d follower process(es) connected", followers)
        return cls(sockets, on_lost)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def wait_lost(self, timeout_s: float) -> bool:
        return self._lost.wait(timeout_s)

    def _monitor(self, pid: int, sock: socket.socket) -> None:
        sock.settimeout(LOST_AFTER_S)
        try:
            while True:
                frame = _recv_frame(sock)
                if frame is None:
                    reason = f"process {pid} is gone (its connection closed)"
                    break
                if frame:  # not a heartbeat: a program the follower has adopted
                    kind, key = pickle.loads(frame)
                    if kind == "ready":
                        with self._ready_changed:
                            self._ready[pid].add(key)
                            self._ready_changed.notify_all()
        except TimeoutError:
            reason = f"process {pid} stopped answering (no heartbeat for {LOST_AFTER_S:.0f} s)"
        except OSError as exc:
            reason = f"process {pid}'s connection failed: {exc}"
        if not self._stopping:
            self._mark_lost(reason)

    def wait_ready(self, key) -> bool:
        """Wait until every follower has adopted program `key` (`FollowerLink.report_ready`): True, or False once
        the cluster is lost or stopping (then it is never adopted)."""
        with self._ready_changed:
            while not all(key in ready for ready in self._ready.values()):
                if self._lost.is_set() or self._stopping:
                    return False
                self._ready_changed.wait(0.5)
        return True

    def _mark_lost(self, reason: str) -> None:
        with self._lost_lock:
            if self.lost_reason is not None:
                return
            self.lost_reason = reason
        log.error("Follower lost: %s", reason)
        if self._on_lost is not None:
            self._on_lost(reason)  # before the event: the server answers 503 before any step reports a failure
        self._lost.set()

    def send(self, name: str, args: tuple, kwargs: dict) -> None:
        payload = pickle.dumps((name, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            if self._lost.is_set():
                raise ClusterLost(self.lost_reason)
            failed = None
            for pid, sock in self._sockets.items():
                try:
                    _send_frame(sock, payload)
                except OSError as exc:
                    failed = f"process {pid}'s connection failed: {exc}"
                    break
        if failed is not None:
            self._mark_lost(failed)
            raise ClusterLost(failed)

    def stop(self) -> None:
        self._stopping = True
        with self._send_lock:
            for sock in self._sockets.values():
                try:
                    _send_frame(sock, pickle.dumps(_STOP))
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass


class FollowerLink:
    def __init__(self, sock: socket.socket, on_leader_lost: Callable[[str], None]) -> None:
        self._sock = sock
        self._calls: queue.Queue = queue.Queue()
        self._on_leader_lost = on_leader_lost
        self._send_lock = threading.Lock()
        threading.Thread(target=self._read, name="jaxchat-link-read", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="jaxchat-link-heartbeat", daemon=True).start()

    @classmethod
    def connect(cls, process_id: int, signature: str, timeout_s: float = 3600.0,
                on_leader_lost: Callable[[str], None] | None = None) -> FollowerLink:
        info = json.loads(cluster.lookup(LINK_KEY, timeout_s))
        sock = socket.create_connection((info["host"], info["port"]), timeout=30)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send_frame(sock, json.dumps({"process": process_id, "token": info["token"], "signature": signature}).encode())
        log.info("Following process 0 at %s:%d", info["host"], info["port"])
        return cls(sock, on_leader_lost or _exit_now)

    def _read(self) -> None:
        try:
            while True:
                frame = _recv_frame(self._sock)
                if frame is None:
                    break
                call = pickle.loads(frame)
                self._calls.put(call)
                if call[0] == "stop":
                    return
        except OSError as exc:
            log.error("the connection to process 0 failed: %s", exc)
        self._on_leader_lost("process 0 is gone (its connection closed)")

    def _heartbeat(self) -> None:
        while True:
            try:
                with self._send_lock:
                    _send_frame(self._sock, b"")
            except OSError:
                return
            time.sleep(HEARTBEAT_S)

    def report_ready(self, key) -> None:
        """Tell process 0 this process has adopted program `key` (it may now name it in a step); nothing when
        process 0 is gone (this process is stopping)."""
        with self._send_lock, contextlib.suppress(OSError):
            _send_frame(self._sock, pickle.dumps(("ready", key), protocol=pickle.HIGHEST_PROTOCOL))

    def next_call(self) -> tuple[str, tuple, dict]:
        return self._calls.get()


def _exit_now(reason: str) -> None:
    log.error("%s: exiting", reason)
    logging.shutdown()
    os._exit(1)  # no atexit: jax.distributed's shutdown would wait for the process that is gone


class BroadcastRunner:
    """The leader's runner as the engine core drives it: each step call goes to the followers first, then runs on
    `runner`; `fetch`, `release` and the step limits are `runner`'s own."""

    def __init__(self, runner, link: LeaderLink) -> None:
        self.runner = runner
        self._link = link

    def _step(self, name: str, method: Callable, *args, **kwargs):
        self._link.send(name, args, kwargs)
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            if self._link.lost or self._link.wait_lost(LOST_AFTER_S):
                raise ClusterLost(self._link.lost_reason) from exc
            raise

    def run(self, *args, **kwargs):
        return self._step("run", self.runner.run, *args, **kwargs)

    def launch(self, *args, **kwargs):
        return self._step("launch", self.runner.launch, *args, **kwargs)

    def sample(self, *args, **kwargs):
        return self._step("sample", self.runner.sample, *args, **kwargs)

    def fetch(self, logprobs: bool = False):
        return self.runner.fetch(logprobs)

    def release(self) -> None:
        self.runner.release()

    @property
    def max_step_tokens(self) -> int:
        return self.runner.max_step_tokens

    @property
    def max_step_rows(self) -> int:
        return self.runner.max_step_rows

    @property
    def max_verify_tokens(self) -> int:
        return self.runner.max_verify_tokens

    @property
    def ragged_rows(self) -> tuple[int, ...]:
        return self.runner.ragged_rows


def step_call(runner, name: str) -> Callable:
    """The runner's method for a step call named on the wire (one of `STEP_CALLS`)."""
    if name == "run":
        return runner.run
    if name == "launch":
        return runner.launch
    if name == "sample":
        return runner.sample
    raise ValueError(f"unknown step call {name!r} from process 0")


def follow(runner, link: FollowerLink) -> None:
    """Replay the leader's step calls on `runner` until it says stop. A call that fails here failed on the
    leader too (same program, same inputs), which carries on: so does the follower."""
    while True:
        name, args, kwargs = link.next_call()
        if name == "stop":
            return
        call = step_call(runner, name)
        try:
            call(*args, **kwargs)
        except Exception:
            log.exception("step %s failed (as it did on process 0)", name)
