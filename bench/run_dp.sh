#!/usr/bin/env bash
# Data-parallel encoder on 2 GPUs: the multigpu tests, then the DP benchmark
# (2 GPUs under torchrun against 1 GPU in a single process) on each workload.
# Logs and JSON in OUT.
#   bash bench/run_dp.sh [OUT] [step...]   (bench/run_gpu.sh's `dp` stage runs all)
#   steps: tests mixed traffic (default: all three; one per command keeps each
#   under 10 minutes)
#   GEN_MIXIN_SMOKE=1 bash bench/run_dp.sh [OUT] [step...]
#       the same steps on the CPU: 2 gloo processes, tiny towers, eager-replay
#       graphs, few iterations (tests: the cpu-gloo run): checks the script,
#       not the numbers.
#   DP_STEMS="..." the towers benchmarked (default: the seed models, as in the
#       2026-11-29 figures; DP_STEMS= with nothing for every spec).
# Files: dp_tests.log, dp_tests/<run>/rank*.json, dp_summary.log and per
# workload: mixed  dp_single.json, dp_bench.json, dp_bench_single.log, dp_bench_dp.log;
#           traffic dp_traffic_single.json, dp_traffic.json, dp_traffic_single.log,
#                   dp_traffic_dp.log.
# Workloads (bench/bench_dp.py): `mixed` 16 seeded images of 224-1344 px a side
# (target 1.7x); `traffic` the first 24 real-traffic batches of
# bench/bench_traffic.py (seed 17, each image resized by the model's processor
# rule; no target: docs/data-parallel.md gives the bound its sharding allows).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/gen-mixin-gpu}}
shift $(($# > 0 ? 1 : 0))
steps=${*:-tests mixed traffic}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# This machine requires NVLink multicast off (NCCL NVLS, symmetric memory,
# NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NPROC=2
TORCHRUN=(python3 -m torch.distributed.run --standalone --nproc_per_node=$NPROC)
read -r -a stems <<<"${DP_STEMS-deepseek_v41 qwen2_vl minimax_m3}"
bench=(${stems[@]:+--stems "${stems[@]}"})
traffic=(--warmup 1 --iters 3)
tests=(-m multigpu)
SUMMARY="$OUT/dp_summary.log"
# Appended to: the steps may run in separate commands.
echo "=== run_dp.sh $steps ($(date -u +%FT%TZ))" >>"$SUMMARY"
status=0

step() {  # name, timeout_s, command...
    local name=$1 limit=$2
    shift 2
    echo "=== dp/$name: $*" | tee -a "$SUMMARY"
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== dp/$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$SUMMARY"
    tail -n 15 "$OUT/$name.log"
    [ $rc -eq 0 ] || status=1
    return $rc
}

if [ "${GEN_MIXIN_SMOKE:-0}" = 1 ]; then
    # Gloo binds to the host name's interface, which containers do not always
    # route; both ranks are local.
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
    bench+=(--device cpu --warmup 1 --iters 2)
    traffic=(--batches 4)
    tests=(-k cpu-gloo)
    echo "GEN_MIXIN_SMOKE=1: CPU, gloo, tiny towers" | tee -a "$SUMMARY"
else
    ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    echo "GPUs: $ngpu; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE" | tee -a "$SUMMARY"
    if [ "${ngpu:-0}" -lt $NPROC ]; then
        echo "run_dp.sh needs $NPROC GPUs" | tee -a "$SUMMARY"
        exit 1
    fi
fi

summarize() {  # dp JSON
    python3 - "$1" <<'EOF' | tee -a "$SUMMARY"
import json, sys
try:
    result = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(f"no {sys.argv[1]}")
comp = result.get("comparison", {})
print(f"workload {result.get('workload', 'mixed')}; skipped: {result.get('skipped', {})}")
for stem, v in comp.get("per_stem", {}).items():
    print(f"{stem:14s} 1 GPU {v['single_images_per_s']:7.1f} img/s  "
          f"2 GPU {v['dp_images_per_s']:7.1f} img/s  x{v['ratio']:.2f}  "
          f"outputs {'match' if v['outputs_match_single'] else 'DIFFER'}")
if comp:
    target = comp["target_ratio"]
    met = "no target" if target is None else (
        f"target {target}x: {'met' if comp['meets_target'] else 'NOT met'}")
    print(f"overall x{comp['overall_ratio']:.2f} ({met})")
EOF
}

workload() {  # workload, single JSON stem, DP JSON stem, log stem, extra args...
    local name=$1 single=$OUT/$2.json dp=$OUT/$3.json log=$4
    shift 4
    rm -f "$single" "$dp"
    step "${log}_single" 300 python3 bench/bench_dp.py --workload "$name" \
        "${bench[@]}" "$@" --out "$single"
    if [ -f "$single" ]; then
        step "${log}_dp" 300 "${TORCHRUN[@]}" bench/bench_dp.py --workload "$name" \
            "${bench[@]}" "$@" --baseline "$single" --out "$dp"
    fi
    summarize "$dp" || status=1
}

for s in $steps; do
    case $s in
        # Correctness over NCCL with CUDA graphs (tiny bf16 towers; set
        # GEN_MIXIN_DP_SIZE=full for the released sizes); gloo on the CPU.
        tests) GEN_MIXIN_DP_OUT="$OUT/dp_tests" step dp_tests 330 \
            python3 -m pytest "${tests[@]}" tests/multigpu -v -rA --tb=short \
            -p no:cacheprovider ;;
        # Throughput, full towers, 1 GPU then 2 GPUs.
        mixed) workload mixed dp_single dp_bench dp_bench ;;
        traffic) workload traffic dp_traffic_single dp_traffic dp_traffic "${traffic[@]}" ;;
        *) echo "unknown step $s" | tee -a "$SUMMARY"; status=2 ;;
    esac
done
echo "=== dp: status=$status" | tee -a "$SUMMARY"
exit $status
