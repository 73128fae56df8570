#!/usr/bin/env bash
# The checks that need a GPU, in one unattended run on a lent GPU machine (docs/distributed.md,
# "GPUs"): the gpu-marked tests (and the device cache's, tests/exec/test_gpu_cache.py, tests/exec/test_gpu_lets.py), the
# benchmark (its device-resident section first: repeated queries with and without the device
# cache beside CuPy, medians of 5), then the random corpora on executor="gpu". The gpu-marked
# tests include the sparse tiles' (CSR on the device, cupyx.scipy.sparse: exec/gpu_sparse.py),
# and part "sparse" runs three seeds of the sparse corpus (tests/sparse/test_sparse_fuzz.py)
# on executor="gpu"; part "spbench" times element-sparse SpMM, SpMV and SpGEMM on the GPU
# executor against cupyx and scipy (tests/bench/bench_gpu_sparse.py).
#
#   bash tests/bench/gpu_device.sh                  # on the GPU machine; results under $OUT
#   GPU_DRY_RUN=1 OUT=/tmp/gpu-out bash tests/bench/gpu_device.sh   # here, on the CPU
#
# The device has CuPy, NumPy, SciPy, pyarrow, opt_einsum, pytest, numba... but not duckdb, lark,
# isal, python-graphblas (with suitesparse-graphblas, cffi, pycparser, donfig), autograd or
# pydata sparse: their wheels (Python 3.12, x86_64; `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 ...` of the versions in .venv) are
# installed from $GPU_WHEELS (default: ../whl beside the source tree; the 2026-11-27 run carried
# them as .whl, ignored by .git/info/exclude, with GPU_WHEELS=$PWD/.whl) into /tmp/site. Each part runs under `timeout`, within the script's budget
# ($GPU_BUDGET_S seconds, default 450), and one part's failure does not stop the next.
# GPU_PARTS picks parts (default: "env tests sparse spbench bench fuzz corpus"), BENCH_ARGS adds arguments to
# bench_gpu.py (e.g. "--only min-plus --budget"), BENCH_LIMIT_S is its time limit, XDIST_N the
# pytest-xdist processes of the corpora (default 4), SPARSE_K the sparse corpus's -k (default three seeds; "not slow": all). In a dry run the corpora run on the local executor (a few fuzz seeds) and
# the benchmark with --dry-run.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpu-out}
WHL=${GPU_WHEELS:-$SRC/../whl}
BUDGET=${GPU_BUDGET_S:-450}
PARTS=${GPU_PARTS:-env tests sparse spbench bench fuzz corpus}
DRY=${GPU_DRY_RUN:-}
START=$(date +%s)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

if [ -n "$DRY" ]; then
    PY=${PYTHON:-python3}
    export PYTHONPATH="$SRC"
else
    PY=${PYTHON:-python3}
    site=/tmp/site
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "$WHL"/*.whl > "$OUT/env.log" 2>&1; then
        echo "wheels: install FAILED (see env.log)" >> "$SUMMARY"
    fi
    export PYTHONPATH="$SRC:$site"
    unset TENSORDB_TEST_EXECUTOR
fi

# part NAME LIMIT_S CMD...: run CMD in $SRC with its output in $OUT/NAME.log, at most LIMIT_S
# seconds and never past the budget; its status goes to summary.txt.
part() {
    local name=$1 limit=$2; shift 2
    case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
    local left=$(( BUDGET - ($(date +%s) - START) ))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        echo "$name: not run (budget spent)" >> "$SUMMARY"
        return 0
    fi
    local t0=$(date +%s)
    (cd "$SRC" && timeout -k 5 "$limit" "$@") >> "$OUT/$name.log" 2>&1
    local rc=$?
    local word=ok
    [ $rc -ne 0 ] && word=FAILED
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && word="TIMED OUT after ${limit}s"
    echo "$name: $word (rc $rc, $(( $(date +%s) - t0 ))s); $(grep -E '^(=+ )?[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "$OUT/$name.log" | tail -1)" >> "$SUMMARY"
}

PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rfE --tb=short)
XDIST=()
if [ -z "$DRY" ] && "$PY" -c "import xdist" 2>/dev/null; then
    XDIST=(-n "${XDIST_N:-4}" -v)  # processes share the one GPU: kernel compilation overlaps
fi

part env 60 bash -c "nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
    $PY -c 'import sys, numpy, duckdb, lark; print(sys.version); print(\"numpy\", numpy.__version__, \"duckdb\", duckdb.__version__)';
    $PY -c 'import cupy; print(\"cupy\", cupy.__version__); cupy.show_config()' | head -30;
    $PY -c 'import tensordb; print(\"tensordb\", tensordb.__version__, tensordb.__file__)'"

part tests ${TESTS_LIMIT_S:-150} "${PYTEST[@]}" tests/exec/test_gpu.py tests/exec/test_gpu_cache.py tests/exec/test_gpu_lets.py
SPARSE_SEEDS=${SPARSE_K:-"test_sparse_fuzz_einsums and (seed0 or seed1 or seed2)"}
if [ -n "$DRY" ]; then
    part sparse 90 "${PYTEST[@]}" tests/sparse/test_sparse_fuzz.py -k "$SPARSE_SEEDS"
else
    part sparse 120 env TENSORDB_TEST_EXECUTOR=gpu "${PYTEST[@]}" "${XDIST[@]}" tests/sparse/test_sparse_fuzz.py -k "$SPARSE_SEEDS"
fi

if [ -n "$DRY" ]; then
    part spbench 60 "$PY" -m tests.bench.bench_gpu_sparse --dry-run --json "$OUT/spbench.json"
else
    part spbench "${SPBENCH_LIMIT_S:-150}" "$PY" -m tests.bench.bench_gpu_sparse --json "$OUT/spbench.json"
fi

if [ -n "$DRY" ]; then
    part bench 60 "$PY" -m tests.bench.bench_gpu --dry-run --repeat 2 --json "$OUT/bench.json" --md "$OUT/bench.md" ${BENCH_ARGS:-}
    part fuzz 120 "${PYTEST[@]}" tests/corpus/test_fuzz.py -k "test_fuzz_einsums and (seed0 or seed1)"
    part corpus 60 "${PYTEST[@]}" tests/corpus/test_engine_corpus.py -k "seed0- or seed1- or numpy_spec"
else
    part bench "${BENCH_LIMIT_S:-240}" "$PY" -m tests.bench.bench_gpu --repeat 5 --json "$OUT/bench.json" --md "$OUT/bench.md" ${BENCH_ARGS:-}
    part fuzz 150 env TENSORDB_TEST_EXECUTOR=gpu "${PYTEST[@]}" "${XDIST[@]}" tests/corpus/test_fuzz.py -k "test_fuzz_einsums and not slow"
    part corpus 90 env TENSORDB_TEST_EXECUTOR=gpu "${PYTEST[@]}" "${XDIST[@]}" tests/corpus/test_engine_corpus.py
fi

echo "total: $(( $(date +%s) - START ))s" >> "$SUMMARY"
cat "$SUMMARY"
[ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"
exit 0
