#!/usr/bin/env bash
# Set up jaxchat on a Cloud TPU VM: a Python virtual environment, jax[tpu], the package, the offline
# assets, then a smoke check that prints jax.devices() and fails unless they are TPUs (on TPU it also runs the
# Pallas attention kernel once on every chip), then warms up the engine on a 2-layer random model and generates.
# Idempotent: run it again and it reuses the environment, pip finds everything installed and the
# asset fetcher downloads nothing. See docs/tpu.md.
set -euo pipefail

PROG="tpu_setup.sh"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
  cat <<'EOF'
Usage: bash tpu_setup.sh [options]

Set up jaxchat on a Cloud TPU VM (Python 3.11+ and access to the package index needed):
  1. a virtual environment (default: .venv in the repository root),
  2. torch (CPU wheel, for xgrammar), then the package with its TPU extra: pip install -e ".[tpu]",
  3. the offline assets (python -m jaxchat.assets fetch: the default model, chat templates),
  4. a smoke check that prints jax.devices() and fails unless the platform is the expected one; on
     TPU it runs the Pallas attention kernel on every chip; then an engine warm-up on a 2-layer
     random model (its programs compiled, one greedy generation) on this host's devices.

Options:
  --venv DIR                  the virtual environment to create or reuse (default: .venv in the
                              repository root; a relative DIR is relative to the current directory)
  --skip-install              do not create the environment or run pip (it must already exist)
  --skip-assets               do not fetch the assets
  --check-only                only run the smoke check in an existing environment
  --expect-platform PLATFORM  tpu (default), gpu or cpu: what the smoke check requires; gpu
                              installs jax[cuda12] instead of the TPU extra, cpu plain jax
  -h, --help                  show this help and exit

Environment:
  PYTHON                      the interpreter that creates the environment (default: the first of
                              python3.13, python3.12, python3.11, python3 that is 3.11 or newer)
  JAXCHAT_TORCH_INDEX_URL     where the torch CPU wheel comes from (default:
                              https://download.pytorch.org/whl/cpu; set it empty to use the
                              ordinary package index)
  JAXCHAT_CACHE               where assets are cached (default: ~/.cache/jaxchat)
EOF
}

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}

usage_error() {
  echo "$PROG: $*" >&2
  echo "Try 'bash $PROG --help' for the options." >&2
  exit 2
}

VENV="$ROOT/.venv"
SKIP_INSTALL=0
SKIP_ASSETS=0
CHECK_ONLY=0
EXPECT="tpu"

while [ "$#" -gt 0 ]; do
  case "$1" in
    --venv)
      [ "$#" -ge 2 ] || usage_error "option --venv needs a directory"
      VENV="$2"
      shift 2
      ;;
    --venv=*)
      VENV="${1#--venv=}"
      shift
      ;;
    --skip-install)
      SKIP_INSTALL=1
      shift
      ;;
    --skip-assets)
      SKIP_ASSETS=1
      shift
      ;;
    --check-only)
      CHECK_ONLY=1
      shift
      ;;
    --expect-platform)
      [ "$#" -ge 2 ] || usage_error "option --expect-platform needs one of: tpu, gpu, cpu"
      EXPECT="$2"
      shift 2
      ;;
    --expect-platform=*)
      EXPECT="${1#--expect-platform=}"
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      usage_error "unknown option: $1"
      ;;
  esac
done

case "$EXPECT" in
  tpu | gpu | cpu) ;;
  *) usage_error "--expect-platform must be tpu, gpu or cpu, not '$EXPECT'" ;;
esac
[ -n "$VENV" ] || usage_error "option --venv needs a directory"
case "$VENV" in
  /*) ;;
  *) VENV="$PWD/$VENV" ;;
esac
PY="$VENV/bin/python"

step() {
  echo
  echo "==> $*"
}

# A Python interpreter >= 3.11 to create the environment with.
find_python() {
  local candidates=()
  if [ -n "${PYTHON:-}" ]; then
    candidates=("$PYTHON")
  else
    candidates=(python3.13 python3.12 python3.11 python3)
  fi
  local py
  for py in "${candidates[@]}"; do
    if command -v "$py" >/dev/null 2>&1 &&
      "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$py"
      return 0
    fi
  done
  return 1
}

check_venv_python() {
  "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' ||
    die "$VENV has Python $("$PY" -c 'import platform; print(platform.python_version())'); jaxchat needs 3.11+ (remove $VENV, or pass another --venv, and rerun)"
}

create_venv() {
  if [ -x "$PY" ]; then
    echo "reusing the virtual environment $VENV"
    check_venv_python
    return 0
  fi
  local python
  python="$(find_python)" ||
    die "no Python 3.11+ found (tried ${PYTHON:-python3.13 python3.12 python3.11 python3}); install one, e.g. 'sudo apt-get install -y python3.11 python3.11-venv', and rerun with PYTHON=python3.11"
  echo "creating the virtual environment $VENV with $python ($("$python" -c 'import platform; print(platform.python_version())'))"
  "$python" -m venv "$VENV" ||
    die "'$python -m venv $VENV' failed; on Debian/Ubuntu install the venv module ('sudo apt-get install -y python3.11-venv' for Python 3.11) and rerun"
}

pip_install() {
  "$PY" -m pip install -q --disable-pip-version-check "$@"
}

install_packages() {
  step "installing packages into $VENV"
  pip_install --upgrade pip
  # xgrammar imports torch; jaxchat never runs it, so the CPU wheel (a fraction of the CUDA one's
  # size) is enough on every platform.
  local torch_index="${JAXCHAT_TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
  if [ -n "$torch_index" ]; then
    echo "torch (CPU wheel from $torch_index)"
    pip_install "torch==2.13.0" --index-url "$torch_index"
  else
    echo "torch (from the default package index)"
    pip_install "torch==2.13.0"
  fi
  case "$EXPECT" in
    tpu)
      echo "jaxchat with its TPU extra: pip install -e \"${ROOT}[tpu]\" (the jax/jaxlib/libtpu the tests ran with)"
      pip_install -e "${ROOT}[tpu]"
      ;;
    gpu)
      echo "jaxchat and jax[cuda12]"
      pip_install -e "$ROOT" "jax[cuda12]"
      ;;
    cpu)
      echo "jaxchat (CPU jax)"
      pip_install -e "$ROOT"
      ;;
  esac
}

fetch_assets() {
  step "fetching the offline assets (cache: ${JAXCHAT_CACHE:-$HOME/.cache/jaxchat})"
  "$PY" -m jaxchat.assets fetch
}

# Prints jax.devices() and the mesh jaxchat's engine builds; exits 1 unless the platform is $EXPECT; then the
# kernel check (TPU) and the engine warm-up (jaxchat/engine/smoke.py).
smoke_check() {
  step "smoke check: jax.devices() must be $EXPECT devices"
  [ -x "$PY" ] || die "no virtual environment at $VENV (no $PY): run 'bash $PROG' without --check-only/--skip-install first, or pass --venv DIR"
  "$PY" - "$EXPECT" <<'PYEOF'
import os
import sys

expect = sys.argv[1]
name = expect.upper()


def fail(why: str) -> None:
    print(f"no {name} devices found: {why}", file=sys.stderr)
    hints = []
    if os.environ.get("JAX_PLATFORMS"):
        hints.append(f"JAX_PLATFORMS={os.environ['JAX_PLATFORMS']} is set in the environment; unset it")
    if expect == "tpu":
        hints += [
            "is this a Cloud TPU VM? ('ls /dev/accel* /dev/vfio' lists the chips)",
            "another process may hold the TPU: 'sudo lsof -w /dev/accel* /dev/vfio/*' finds it; stop it",
            "is jax[tpu] installed? ('pip show libtpu'; rerun tpu_setup.sh without --skip-install)",
        ]
    elif expect == "gpu":
        hints += ["is jax installed with CUDA? ('pip show jax-cuda12-plugin'); does 'nvidia-smi' see the GPU?"]
    for hint in hints:
        print(f"  hint: {hint}", file=sys.stderr)
    print("  see docs/tpu.md (Troubleshooting)", file=sys.stderr)
    sys.exit(1)


try:
    import jax

    from jaxchat.engine.cluster import join_cluster, pod_slice_detected

    if pod_slice_detected():  # every worker runs this check at once (--worker=all): one runtime over the slice
        join_cluster()
except Exception as exc:  # noqa: BLE001 - reported with the reason
    fail(f"jax does not import: {type(exc).__name__}: {exc}")
try:
    devices = jax.devices()
except Exception as exc:  # noqa: BLE001 - reported with the reason
    fail(f"jax could not initialise a backend: {type(exc).__name__}: {exc}")
print(f"jax {jax.__version__}, default backend: {jax.default_backend()}")
print(f"jax.devices(): {devices}")
platforms = sorted({d.platform for d in devices})
if expect not in platforms:
    fail(f"jax.devices() returned {devices} (platform {', '.join(platforms)})")
local = jax.local_devices()
print(f"process {jax.process_index()} of {jax.process_count()}: {len(local)} local of {jax.device_count()} devices")
if jax.device_count() > len(local):
    print(f"multi-host slice: the mesh spans all {jax.device_count()} devices of {jax.process_count()} hosts "
          "(see docs/tpu.md, 'Pod slices')")

try:
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxchat.engine.step import make_mesh
except Exception as exc:  # noqa: BLE001 - reported with the reason
    print(f"jaxchat does not import in this environment: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
mesh = make_mesh()
n = mesh.devices.size
print(f"jaxchat mesh (the engine's default): axis 'tp' over {n} device(s)")
local_part = np.arange(8 * n, dtype=np.float32)
x = jax.make_array_from_callback(local_part.shape, NamedSharding(mesh, P("tp")), lambda index: local_part[index])
total = float(jax.jit(jnp.sum)(x))
want = float(np.arange(8 * n, dtype=np.float32).sum())
if total != want:
    print(f"a sharded sum over the mesh gave {total}, expected {want}", file=sys.stderr)
    sys.exit(1)
print(f"sharded computation over all {n} device(s): ok")
if expect == "tpu":  # the Pallas attention kernel the engine serves with, compiled and run on every chip
    try:
        from jaxchat.engine.kernel_check import TOLERANCE, kernel_error

        errors = [kernel_error(d) for d in local]
    except Exception as exc:  # noqa: BLE001 - reported with the reason
        print(f"the Pallas attention kernel failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    if max(errors) > TOLERANCE:
        print(f"the Pallas attention kernel disagrees with JAX's reference: errors {errors}", file=sys.stderr)
        sys.exit(1)
    print(f"Pallas attention kernel on all {len(local)} local chip(s): ok (largest error {max(errors):.4f})")
# the engine itself on this host's chips: a 2-layer random model, its pool, its programs compiled, one greedy
# generation (on TPU the Pallas kernel under shard_map; python -m jaxchat.engine.smoke runs the same alone)
try:
    from jaxchat.engine.smoke import engine_warmup

    result = engine_warmup(local)
except Exception as exc:  # noqa: BLE001 - reported with the reason
    print(f"the engine warm-up failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
print(result.line())
if not result.ok:
    sys.exit(1)
PYEOF
}

print_next_steps() {
  local bin="$VENV/bin"
  cat <<EOF

==> ready
Serve the default model (Qwen2.5-Coder-0.5B-Instruct) on 127.0.0.1:8000:
  $bin/jaxchat serve

Serve an HF checkpoint directory (config.json, *.safetensors, tokenizer files) across all chips of
this VM: the engine builds a mesh over every local device (axis 'tp') and shards attention heads,
MLP units and the vocabulary over it (tensor parallel; a dimension that does not divide by the
number of chips stays replicated):
  $bin/jaxchat serve --model /path/to/hf_dir --dtype bfloat16 --max-batch 32
Add --host 0.0.0.0 --api-key KEY (or JAXCHAT_API_KEY) to accept other machines; --max-context N
sets tokens per sequence (default 4096).

Multi-host pod slices: run the same command on every worker at once. The workers join one JAX
runtime (jax.distributed finds its peers on a pod slice), each reads only its own shards of the
weights onto one mesh over every chip of the slice, and worker 0 serves HTTP:
  gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all --command 'cd /path/to/jaxchat && bash tpu_setup.sh'
  gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all --command 'cd /path/to/jaxchat && .venv/bin/jaxchat serve --model /path/to/hf_dir --dtype bfloat16 --host 0.0.0.0'
Outside a pod slice, name the processes yourself: on process I of N,
  $bin/jaxchat serve --model /path/to/hf_dir --coordinator HOST0:PORT --num-processes N --process-id I
See docs/tpu.md ('Pod slices') for checking it and for what happens when a host fails.
EOF
}

if [ "$CHECK_ONLY" -eq 1 ]; then
  smoke_check
  exit 0
fi
if [ "$SKIP_INSTALL" -eq 1 ]; then
  [ -x "$PY" ] || die "--skip-install: no virtual environment at $VENV (no $PY)"
  check_venv_python
else
  step "virtual environment"
  create_venv
  install_packages
fi
if [ "$SKIP_ASSETS" -eq 0 ]; then
  fetch_assets
fi
smoke_check
print_next_steps
