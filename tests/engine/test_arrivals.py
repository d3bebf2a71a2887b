"""`Arrivals`: requests announced by the server, counted until submitted from their own context or closed."""

from __future__ import annotations

import asyncio
import contextvars
import time

from jaxchat.engine.arrivals import Arrivals


def test_an_arrival_is_pending_until_submitted_from_its_own_context():
    woken: list[int] = []
    arrivals = Arrivals(lambda: woken.append(1))
    first, second = contextvars.copy_context(), contextvars.copy_context()
    first.run(arrivals.expect)
    second.run(arrivals.expect)
    assert arrivals.pending(60) == 2
    arrivals.submitted()  # this context announced nothing: nothing closes
    assert arrivals.pending(60) == 2 and woken == []
    first.run(arrivals.submitted)
    assert arrivals.pending(60) == 1 and woken == [1]
    first.run(arrivals.submitted)  # closed already: no change, no wake-up
    assert arrivals.pending(60) == 1 and woken == [1]


def test_tasks_started_by_the_announcing_handler_inherit_its_arrival():
    arrivals = Arrivals()

    async def handler():
        arrivals.expect()

        async def pump():  # the service's per-choice task, which submits to the engine
            arrivals.submitted()

        assert arrivals.pending(60) == 1
        await asyncio.ensure_future(pump())
        return arrivals.pending(60)

    assert asyncio.run(handler()) == 0


def test_a_closed_arrival_stops_counting_and_an_old_one_is_forgotten():
    arrivals = Arrivals()
    ctx = contextvars.copy_context()
    arrival = ctx.run(arrivals.expect)
    arrival.close()
    arrival.close()
    assert arrivals.pending(60) == 0
    contextvars.copy_context().run(arrivals.expect)  # nobody closes this one
    time.sleep(0.05)
    assert arrivals.pending(60) == 1
    assert arrivals.pending(0.01) == 0  # announced longer ago than that: forgotten for good
    assert arrivals.pending(60) == 0


def test_a_submission_closes_only_its_own_engines_arrival():
    """Two engines in one process (a test, a notebook): submitting to one does not close an arrival the other
    announced in the same context."""
    mine, other = Arrivals(), Arrivals()
    ctx = contextvars.copy_context()
    ctx.run(other.expect)
    ctx.run(mine.submitted)
    assert other.pending(60) == 1
    ctx.run(other.submitted)
    assert other.pending(60) == 0
