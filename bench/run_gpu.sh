#!/usr/bin/env bash
# One command for a GPU machine: every GPU test and benchmark, logs in $OUT.
#   bash bench/run_gpu.sh [stage...]    stages: smoke tests overhead profile bench dp
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gen-mixin-gpu}
mkdir -p "$OUT"
stages=${*:-smoke tests overhead}
status=0
run() {  # name, command...
    local name=$1; shift
    echo "=== $name: $*" | tee -a "$OUT/summary.log"
    local start=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name: rc=$rc in $((SECONDS - start)) s" | tee -a "$OUT/summary.log"
    tail -n 25 "$OUT/$name.log"
    [ $rc -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/summary.log" 2>&1
for stage in $stages; do
    case $stage in
        smoke) run smoke python3 bench/gpu_smoke.py ;;
        tests) GEN_MIXIN_GPU_SUMMARY="$OUT/gpu_summary.jsonl" run tests \
                   python3 -m pytest -m gpu tests/gpu -v -rA --tb=short -p no:cacheprovider ;;
        profile) run profile python3 bench/profile_execute.py --out "$OUT/profile.json" \
                   --text "$OUT/profile.txt" --cprofile --kernels --plain ;;
        overhead) run overhead python3 bench/bench_manager_overhead.py --out "$OUT/overhead.json" ;;
        bench) run bench python3 bench/bench_encoders.py --out "$OUT/bench.json" \
                   --markdown "$OUT/bench.md" --plot "$OUT/bench.png" ;;
        dp) run dp bash bench/run_dp.sh "$OUT" ;;
        *) echo "unknown stage $stage"; status=2 ;;
    esac
done
exit $status
