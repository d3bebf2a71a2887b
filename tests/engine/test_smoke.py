"""jaxchat/engine/smoke.py: the engine warm-up `tpu_setup.sh` runs, here on CPU (the jnp path), and its verdict."""

from __future__ import annotations

from jaxchat.engine import attention_tpu, smoke


def test_the_config_gives_each_device_a_share_the_kernel_tiles():
    for devices in (1, 2, 4, 8, 16):
        cfg = smoke.smoke_config(devices)
        assert cfg.num_layers == 2 and cfg.head_dim == 128 and cfg.num_kv_heads == devices
        assert attention_tpu.unsupported(cfg, "bfloat16", devices) is None


def test_a_wrong_generation_or_a_late_compile_fails():
    good = smoke.SmokeResult(1, "cpu", "xla", 3, 1.0, [1, 2], 2, 1024, 0)
    assert good.ok and good.line().endswith(": ok")
    for bad in (dict(tokens=[1]), dict(tokens=[1, 1024]), dict(compiles_after_warmup=1)):
        result = smoke.SmokeResult(**{**good.__dict__, **bad})
        assert not result.ok and "FAILED" in result.line()


def test_python_m_smoke_warms_up_and_generates_on_cpu(capsys):
    assert smoke.main(["--new-tokens", "4"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("engine warm-up on 1 cpu device(s), 2-layer random model, attention xla: 3 programs")
    assert line.endswith(": ok")
