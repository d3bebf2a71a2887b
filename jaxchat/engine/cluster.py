"""Joining several processes into one JAX runtime (multi-host serving): `jax.distributed` and one global mesh.

Contract:
- `join_cluster(coordinator=None, num_processes=None, process_id=None)` calls `jax.distributed.initialize`
  before anything else touches a JAX backend. With a coordinator ("HOST:PORT", the address of process 0, which
  runs JAX's coordination service there) the three values are passed as given; with none of them, on a
  Cloud TPU pod slice (`pod_slice_detected()`: `TPU_WORKER_HOSTNAMES` names more than one host), JAX finds
  its peers itself. On CPU the cross-process collectives are gloo's
  (`jax_cpu_collectives_implementation`). Returns this process's index (0 serves HTTP; the others follow).
  Anything else (a coordinator without the process count or index, an index out of range) raises
  `ValueError` naming the flag, so the CLI can print it.
- `multi_process()` says whether this runtime spans several processes; `publish(key, value)` and
  `lookup(key, timeout_s)` share small strings through the coordination service's key-value store (how the
  followers learn where process 0's step link listens); `coordinator_host()` is the host part of the
  coordinator's address (process 0's, as the peers reach it).
- Faults: JAX's own heartbeat (`heartbeat_timeout_s`) is a backstop only; the step link
  (`jaxchat.engine.step_link`) notices a lost process within seconds.
"""

from __future__ import annotations

import os

HEARTBEAT_TIMEOUT_S = 60  # JAX's coordination service; jaxchat's step link reacts long before this


def pod_slice_detected() -> bool:
    """Whether this is one worker of a multi-host Cloud TPU slice (the TPU VM sets `TPU_WORKER_HOSTNAMES`)."""
    hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    return len(hosts) > 1


def wants_cluster(coordinator: str | None, num_processes: int | None, process_id: int | None) -> bool:
    return coordinator is not None or num_processes is not None or process_id is not None or pod_slice_detected()


def join_cluster(coordinator: str | None = None, num_processes: int | None = None,
                 process_id: int | None = None) -> int:
    given = (coordinator, num_processes, process_id)
    if any(v is not None for v in given) and any(v is None for v in given):
        raise ValueError("--coordinator, --num-processes and --process-id go together (or none of them, on a "
                         "TPU pod slice)")
    if coordinator is not None:
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--coordinator {coordinator!r} is not HOST:PORT")
        if num_processes < 2:
            raise ValueError("--num-processes must be at least 2")
        if not 0 <= process_id < num_processes:
            raise ValueError(f"--process-id {process_id} is not in 0..{num_processes - 1}")
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only; TPUs use their own
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
                               heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
    return jax.process_index()


def multi_process() -> bool:
    import jax

    return jax.process_count() > 1


def _client():
    from jax._src import distributed  # the coordination service's client: no public handle exists

    if distributed.global_state.client is None:
        raise RuntimeError("jax.distributed is not initialised")
    return distributed.global_state.client


def publish(key: str, value: str) -> None:
    _client().key_value_set(key, value)


def lookup(key: str, timeout_s: float) -> str:
    return _client().blocking_key_value_get(key, int(timeout_s * 1000))


def coordinator_host() -> str:
    from jax._src import distributed

    address = distributed.global_state.coordinator_address or "127.0.0.1:0"
    return address.rpartition(":")[0].strip("[]") or "127.0.0.1"
