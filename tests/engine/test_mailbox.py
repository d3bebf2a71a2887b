"""Engine-to-event-loop delivery: posted calls wait for `flush`, run in order, wake each loop once per
flush, and a closed loop's calls turn into `on_closed` instead of an exception. `flush(wait_s)` returns once
the tasks the calls woke have run, and after `wait_s` at most when the loop is busy."""

from __future__ import annotations

import asyncio
import threading
import time

from jaxchat.engine.mailbox import Mailbox


def test_calls_wait_for_flush_and_run_in_order_with_one_wakeup_per_loop():
    mailbox = Mailbox()
    seen: list[int] = []
    wakeups = []

    async def main():
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def counting(*args):
            wakeups.append(threading.current_thread().name)
            return real(*args)

        loop.call_soon_threadsafe = counting
        done = asyncio.Event()

        posted_only: list[int] = []

        def engine_thread():
            for i in range(16):
                mailbox.post(loop, lambda i=i: seen.append(i), lambda: None)
            posted_only.extend(seen)
            mailbox.flush()
            mailbox.post(loop, done.set, lambda: None)
            mailbox.flush()

        thread = threading.Thread(target=engine_thread)
        thread.start()
        await asyncio.wait_for(done.wait(), 5)
        thread.join()
        return posted_only

    before_flush = asyncio.run(main())
    assert before_flush == []
    assert seen == list(range(16))
    assert len(wakeups) == 2  # one per flush, not one per call


def test_a_closed_loop_runs_on_closed_instead():
    mailbox = Mailbox()
    loop = asyncio.new_event_loop()
    loop.close()
    delivered, gone = [], []
    for i in range(3):
        mailbox.post(loop, lambda i=i: delivered.append(i), lambda i=i: gone.append(i))
    mailbox.flush()
    assert delivered == [] and gone == [0, 1, 2]
    mailbox.flush()  # nothing left pending
    assert gone == [0, 1, 2]


def test_flush_with_a_wait_returns_after_the_woken_task_ran():
    mailbox = Mailbox()
    order: list[str] = []

    async def main():
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str] = asyncio.Queue()

        async def stream():  # as a response stream: wakes on its queue, then writes
            order.append("wrote " + await queue.get())

        task = asyncio.create_task(stream())
        await asyncio.sleep(0)

        def engine_thread():
            mailbox.post(loop, lambda: queue.put_nowait("first token"), lambda: None)
            mailbox.flush(wait_s=5.0)
            order.append("flush returned")

        thread = threading.Thread(target=engine_thread)
        thread.start()
        await task
        await asyncio.to_thread(thread.join)

    asyncio.run(main())
    assert order == ["wrote first token", "flush returned"]


def test_flush_waits_no_longer_than_wait_s_for_a_busy_loop():
    mailbox = Mailbox()
    loop = asyncio.new_event_loop()  # never run: as a loop blocked by other work
    try:
        mailbox.post(loop, lambda: None, lambda: None)
        t0 = time.monotonic()
        mailbox.flush(wait_s=0.05)
        assert 0.04 <= time.monotonic() - t0 < 1.0
    finally:
        loop.close()
