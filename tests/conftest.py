"""Session-wide pytest hooks and settings: the reliability tests' counts are printed at the end of every run, so CI's
output shows requests sent, 4xx, 5xx, completed, leaked slots and memory growth even when all pass."""

from __future__ import annotations

import os

import pytest

# Tiny models' step programs compile with XLA's fast-compile options (JAXCHAT_FAST_COMPILE_BELOW,
# jaxchat/engine/compile_level.py) in the files listed here only: model and engine tests whose engines run a few
# dozen tokens, where compiling is most of the time (a tiny engine's first set: 3.2 s -> 1.7 s of compiling; the
# 8-device expert-parallel test 55 s -> 41 s). Elsewhere it stays off: the unoptimised code runs some 2-5x
# slower (a tiny chat model's 192 tokens 0.6 s -> 1.2 s), and the end-to-end files, which generate more, lost
# (tests/e2e/test_truncation.py alone, cold: 121 s -> 156 s). Models of FAST_COMPILE_PARAMS parameters or more (the
# default model, SmolLM2-135M) compile as users get them wherever they run. tests/test_fast_compile_paths.py
# fails when an entry names nothing.
FAST_COMPILE_PARAMS = 50_000_000
FAST_COMPILE_PATHS = (
    "tests/models/",
    "tests/engine/test_engine.py",
    "tests/engine/test_pool_plan.py",
    "tests/engine/test_paged_engine.py",
    "tests/engine/test_attention_backends.py",
    "tests/engine/test_attention_tpu.py",
    "tests/engine/test_gemma4_model.py",
    "tests/engine/test_overlap.py",
    "tests/engine/test_replicas.py",
    "tests/engine/test_jump_forward.py",
    "tests/engine/test_prefix_cache.py",
    "tests/engine/test_family_generate.py",
    "tests/engine/test_real_model.py",  # its tiny checkpoints (SmolLM2-135M's programs stay as users get them)
    "tests/e2e/test_family_formats.py",  # one short constrained reply per family: alone, cold, 62 s -> 50 s
)


@pytest.fixture(scope="module", autouse=True)
def _fast_compile_for_listed_files(request):
    """Set JAXCHAT_FAST_COMPILE_BELOW for the module's engines (and the processes its tests start) when the
    module is one of FAST_COMPILE_PATHS; autouse, so it is in place before the module's own fixtures build them."""
    from jaxchat.engine.compile_level import FAST_COMPILE_ENV

    if not request.node.nodeid.startswith(FAST_COMPILE_PATHS):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(FAST_COMPILE_ENV, str(FAST_COMPILE_PARAMS))
        yield


# `jaxchat serve` and `jaxchat.LLM()` started by the tests (servers, notebooks' kernels: they inherit this) compile
# their first set of programs only (jaxchat/engine/program_set.py): the default "background" would go on
# compiling programs these short-lived engines never run, beside the other tests on the same 2 cores. The
# background is tested where it is the subject (tests/engine/test_background_compile.py,
# tests/e2e/test_warm_start.py), and the real 0.5B's server and the notebooks keep it (each step of the 0.5B pays
# for its program's size: a first set alone made the default model's server tests 254 s instead of 158 s).
os.environ.setdefault("JAXCHAT_PROGRAMS", "first")


def pytest_runtest_logreport(report):
    from tests import file_times

    file_times.record(report)


def pytest_terminal_summary(terminalreporter):
    import sys

    from tests import file_times

    if not hasattr(terminalreporter.config, "workerinput"):  # the xdist controller (or a plain run) sees every file
        terminalreporter.section("per-file times")
        file_times.write_summary(terminalreporter.write_line)

    support = sys.modules.get("tests.reliability.support")
    lines = getattr(support, "REPORTS", None)
    if lines:
        terminalreporter.section("reliability counts")
        for line in lines:
            terminalreporter.write_line(line)


# Tests that bound wall time, count compiles on a shared service or signal servers: scripts/test.sh runs
# them alone after the rest, which it runs on 2 workers. These folders are marked whole here; a timing-sensitive
# test elsewhere carries `@pytest.mark.serial` itself (tests/engine/test_bursts.py).
SERIAL = ("tests/reliability/", "tests/server/")


# The longest files first, longest to shortest as measured (each runs whole on one xdist worker, and
# scripts/test.sh keeps this order with --no-loadscope-reorder): started last, one of them would run alone at
# the end while the other worker idles. Derived from tests/file_times.json, the per-file table of a measured
# cold run (scripts/test.sh writes a new one to .test-times/; docs/testing.md says how to refresh it).
LONGEST_FIRST_SECONDS = 20.0  # files slower than this are handed out first


def longest_first(table_path=None) -> tuple[str, ...]:
    import json
    from pathlib import Path

    path = Path(table_path) if table_path else Path(__file__).with_name("file_times.json")
    files = json.loads(path.read_text())["files"]
    ranked = sorted(files.items(), key=lambda kv: (-kv[1], kv[0]))
    return tuple(name for name, seconds in ranked if seconds >= LONGEST_FIRST_SECONDS)


LONGEST_FIRST = longest_first()


def pytest_collection_modifyitems(session, config, items):
    """Mark the `serial` tests, then order the longest files first (the notebooks among them: each starts a
    kernel, and one a server, with the default model while the pytest processes are still small; measured peak
    well inside 24 GiB)."""
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)

    def rank(item) -> int:
        for i, prefix in enumerate(LONGEST_FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within each file and among the rest is kept


@pytest.fixture(scope="module", autouse=True)
def _release_programs_after_each_file(request):
    """After each test file (its module fixtures torn down first): drop JAX's compiled programs
    (tests/program_release.py). An XLA:CPU executable holds a few memory mappings for its code for as long as it
    lives, and one xdist worker runs hundreds of files: kept alive, their programs reached Linux's 65,530
    mappings per process (vm.max_map_count), after which LLVM cannot map code ("Cannot allocate memory") and the
    worker aborted or hung. $JAXCHAT_TEST_MAPS_LOG names a file that gets each file's mapping count after it."""
    yield
    from tests.program_release import memory_maps, release_compiled_programs

    release_compiled_programs()
    log = os.environ.get("JAXCHAT_TEST_MAPS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {memory_maps()} {request.node.nodeid}\n")
