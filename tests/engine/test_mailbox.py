"""Engine-to-event-loop delivery: posted calls wait for `flush`, run in order, wake each loop once per
flush, and a closed loop's calls turn into `on_closed` instead of an exception."""

from __future__ import annotations

import asyncio
import threading

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
