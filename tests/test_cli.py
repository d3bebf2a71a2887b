"""The `jaxchat` command line: help, clear errors for bad arguments, and the terminal chat's rendering."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from jaxchat.chat_tui import DIM, render_stream
from jaxchat.cli import _parser, main


def test_serve_defaults_bind_localhost_and_default_model():
    args = _parser().parse_args(["serve"])
    assert (args.host, args.port, args.model) == ("127.0.0.1", 8000, None)


@pytest.mark.parametrize("argv, message", [
    (["serve", "--port", "0"], "--port must be positive"),
    (["serve", "--max-batch", "-1"], "--max-batch must be positive"),
    (["serve", "--kv-cache-gib", "0"], "--kv-cache-gib must be positive"),
    (["serve", "--page-size", "-16"], "--page-size must be positive"),
    (["serve", "--max-step-tokens", "0"], "--max-step-tokens must be positive"),
    (["serve", "--burst-window-ms", "-5"], "--burst-window-ms must be 0 (off) or positive"),
    (["serve", "--data-parallel", "0"], "--data-parallel must be positive"),
    (["serve", "--max-batch", "8", "--decode-rows", "1,16"], "--decode-rows 16 is above --max-batch 8"),
    (["lower", "--model", "m", "--chip", "v5e", "--devices", "8", "--data-parallel", "-2"],
     "--data-parallel must be positive"),
])
def test_bad_numbers_are_clear_errors(argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert message in str(exc.value)


def test_decode_rows_are_sorted_counts_and_bad_lists_exit_2(capsys):
    assert _parser().parse_args(["serve", "--decode-rows", "8,1,8"]).decode_rows == (1, 8)
    assert _parser().parse_args(["serve"]).decode_rows is None
    for bad, message in (("1,x", "not a comma-separated list"), ("0,4", "must be positive")):
        with pytest.raises(SystemExit) as exc:
            _parser().parse_args(["serve", "--decode-rows", bad])
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_engine_refuses_decode_rows_outside_its_batch():
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.smoke import random_model, smoke_config

    model = random_model(smoke_config(1), "float32")
    for rows in ((), (0, 2), (2, 8)):
        with pytest.raises(ValueError, match="decode_rows"):
            Engine(model, max_batch=4, max_context=32, decode_rows=rows, warmup=False, start=False)


def test_unknown_command_exits_2():
    result = subprocess.run([sys.executable, "-m", "jaxchat.cli", "fly"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2 and "invalid choice" in result.stderr


@pytest.mark.parametrize("module", ["jaxchat", "jaxchat.cli"])
def test_help_lists_commands(module):
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0
    for command in ("serve", "chat", "convert", "bench"):
        assert command in result.stdout


def test_python_m_jaxchat_is_the_command():
    result = subprocess.run([sys.executable, "-m", "jaxchat", "fly"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2 and "usage: jaxchat" in result.stderr


def test_chat_renders_reasoning_dimmed_and_tool_calls():
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "thinking"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "Sure."}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                              "function": {"name": "get_weather", "arguments": '{"city": '}}]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    out = io.StringIO()
    message = render_stream(chunks, out)
    text = out.getvalue()
    assert DIM + "thinking" in text and "Sure." in text and '-> get_weather({"city": "Paris"})' in text
    assert message == {"role": "assistant", "content": "Sure.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}


def test_convert_writes_an_orbax_checkpoint_with_identical_logits(tmp_path):
    import numpy as np

    from jaxchat.models import load_model
    from tests.models.paged import PagedRows
    from tests.tiny_model import tiny_chat_model

    src = tiny_chat_model(tmp_path / "hf")
    assert main(["convert", str(src), str(tmp_path / "orbax")]) == 0
    a, b = load_model(src), load_model(tmp_path / "orbax")
    tokens = np.array([[1, 2, 3, 4]], np.int32)
    positions = np.arange(4, dtype=np.int32)[None]
    out = [PagedRows(m, 1, 16)(tokens, positions) for m in (a, b)]
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(out[1]))
    assert b.chat_template == a.chat_template


def test_convert_quantize_int8_stores_int8_weights_and_serve_chat_accept_the_flag(tmp_path, capsys):
    """`jaxchat convert --quantize int8` writes a checkpoint whose weights load as int8 (values and scales, the
    logits of quantising at load); serve and chat parse the flag; an unknown scheme is a clear usage error."""
    import jax
    import numpy as np

    from jaxchat.models import load_model
    from jaxchat.models.quant import Int8Weight
    from tests.engine.test_real_model import make_checkpoint
    from tests.models.paged import PagedRows

    src = make_checkpoint(tmp_path / "hf")
    assert main(["convert", str(src), str(tmp_path / "int8"), "--quantize", "int8"]) == 0
    stored, at_load = load_model(tmp_path / "int8"), load_model(src, quantize="int8")
    assert stored.quantize == "int8"
    assert any(isinstance(x, Int8Weight) for x in jax.tree.leaves(stored.params, is_leaf=lambda x: isinstance(x, Int8Weight)))
    tokens = np.array([[1, 2, 3, 4]], np.int32)
    positions = np.arange(4, dtype=np.int32)[None]
    out = [PagedRows(m, 1, 16)(tokens, positions) for m in (stored, at_load)]
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(out[1]))
    for command in ("serve", "chat"):
        assert _parser().parse_args([command, "--quantize", "int8"]).quantize == "int8"
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--quantize", "int4"])
    assert exc.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err


@pytest.mark.parametrize("flags, enabled", [([], True), (["--compile-cache", "DIR"], True), (["--no-compile-cache"], False),
                                            (["--no-prefix-cache"], True), (["--no-jump-forward"], True)])
def test_serve_compile_cache_flags(flags, enabled, tmp_path, monkeypatch):
    """`serve` turns JAX's persistent compilation cache on (under the asset cache, or `--compile-cache DIR`)
    before the model loads, or off with `--no-compile-cache` even when the environment names a cache; the two
    flags exclude each other; the serialized step programs are kept in its `executables/` folder, and not at
    all without the cache. (A real warm start is tests/e2e/test_warm_start.py.) The engine's prefix cache
    is on unless `--no-prefix-cache`, jump-forward unless `--no-jump-forward`."""
    import jax

    import jaxchat.api
    import jaxchat.engine.host_memory as host_memory
    import jaxchat.llm  # noqa: F401  (imported by name there: first imported under the patch below, it would keep the stub)
    import jaxchat.server.run

    seen = {}

    class Service:
        model_id = "stub"

        def close(self):
            seen["closed"] = True

    def build(model, config, **kwargs):
        seen["enabled"] = jax.config.jax_enable_compilation_cache
        seen["dir"] = jax.config.jax_compilation_cache_dir
        seen["prefix_cache"] = config.prefix_cache
        seen["executables"] = config.executable_cache
        seen["jump_forward"] = config.jump_forward
        return Service()

    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path / "assets"))
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env-cache"))
    monkeypatch.setattr(jaxchat.api, "build_chat_service", build)
    monkeypatch.setattr(jaxchat.server.run, "serve", lambda *a, **k: None)
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: False)
    monkeypatch.setattr(host_memory, "release_freed_memory", lambda: None)
    saved = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir,
             jax.config.jax_persistent_cache_min_compile_time_secs, jax.config.jax_persistent_cache_min_entry_size_bytes)
    try:
        flags = [str(tmp_path / "explicit") if f == "DIR" else f for f in flags]
        assert main(["serve", *flags]) == 0
    finally:
        for name, value in zip(("jax_enable_compilation_cache", "jax_compilation_cache_dir",
                                "jax_persistent_cache_min_compile_time_secs",
                                "jax_persistent_cache_min_entry_size_bytes"), saved, strict=True):
            jax.config.update(name, value)
    assert seen["enabled"] is enabled and seen["closed"]
    assert seen["prefix_cache"] is ("--no-prefix-cache" not in flags)
    assert seen["jump_forward"] is ("--no-jump-forward" not in flags)
    if enabled:
        expected = tmp_path / ("explicit" if "--compile-cache" in flags else "env-cache")  # the environment's directory is kept
        assert seen["dir"] == str(expected) and expected.is_dir()
        assert seen["executables"] == str(expected / "executables")  # serialized programs live beside XLA's cache
    else:
        assert seen["executables"] is None
    if not flags:  # jaxchat.LLM() keeps its programs in the store a plain `jaxchat serve` uses
        llm_kwargs = {}

        def build_for_llm(model, config=None, **kwargs):
            llm_kwargs.update(kwargs)
            raise RuntimeError("stop after the arguments")

        import jaxchat.llm

        monkeypatch.setattr(jaxchat.llm, "build_chat_service", build_for_llm)
        with pytest.raises(RuntimeError, match="stop after the arguments"):
            jaxchat.llm.LLM(max_batch=2, max_context=512)
        assert str(llm_kwargs["executable_cache"]) == seen["executables"]
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--compile-cache", "x", "--no-compile-cache"])
    assert exc.value.code == 2


@pytest.mark.parametrize("flags, message", [
    (["--coordinator", "127.0.0.1:5000"], "--coordinator, --num-processes and --process-id go together"),
    (["--coordinator", "nohost", "--num-processes", "2", "--process-id", "0"], "'nohost' is not HOST:PORT"),
    (["--coordinator", "127.0.0.1:5000", "--num-processes", "2", "--process-id", "2"], "--process-id 2 is not in 0..1"),
    (["--coordinator", "127.0.0.1:5000", "--num-processes", "1", "--process-id", "0"], "at least 2"),
])
def test_multi_host_flags_are_checked_before_joining(flags, message, monkeypatch):
    """Bad multi-host flags end `serve` with a clear message before anything joins or loads (the multi-host
    path itself is tests/e2e/test_multihost.py)."""
    import jaxchat.engine.host_memory as host_memory

    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: False)
    with pytest.raises(SystemExit) as exc:
        main(["serve", *flags])
    assert message in str(exc.value)


def test_data_parallel_that_does_not_divide_the_devices_is_a_clear_error_before_loading(monkeypatch):
    import jaxchat.engine.host_memory as host_memory

    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: False)
    with pytest.raises(SystemExit) as exc:  # this process has 1 device; the model path is never read
        main(["serve", "--model", "/nonexistent/model", "--no-compile-cache", "--data-parallel", "3"])
    assert "--data-parallel 3 does not divide the 1 devices" in str(exc.value)


@pytest.mark.parametrize("flags, env, expected", [
    ([], None, "background"), ([], "first", "first"), (["--programs", "all"], "first", "all"),
    (["--no-background-compile"], None, "all"), (["--programs", "first"], None, "first"),
    (["--no-background-compile", "--programs", "all"], None, "all"),
])
def test_serve_program_set_from_flags_then_environment(flags, env, expected, monkeypatch):
    """`--programs` wins, `--no-background-compile` means "all", else JAXCHAT_PROGRAMS, else "background";
    `jaxchat.LLM()` takes the same default from the environment."""
    from jaxchat.api import default_programs
    from jaxchat.cli import _program_set

    if env is None:
        monkeypatch.delenv("JAXCHAT_PROGRAMS", raising=False)
    else:
        monkeypatch.setenv("JAXCHAT_PROGRAMS", env)
    assert _program_set(_parser().parse_args(["serve", *flags])) == expected
    if not flags:
        assert default_programs() == expected


@pytest.mark.parametrize("flags, env, message", [
    (["--no-background-compile", "--programs", "first"], None, "contradicts --programs first"),
    ([], "some", "JAXCHAT_PROGRAMS='some': choose one of background, all, first"),
])
def test_serve_program_set_errors_are_clear(flags, env, message, monkeypatch):
    from jaxchat.cli import _program_set

    if env is None:
        monkeypatch.delenv("JAXCHAT_PROGRAMS", raising=False)
    else:
        monkeypatch.setenv("JAXCHAT_PROGRAMS", env)
    with pytest.raises(SystemExit, match=message):
        _program_set(_parser().parse_args(["serve", *flags]))
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--programs", "some"])  # argparse's own choice check, exit 2
