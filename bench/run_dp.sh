#!/usr/bin/env bash
# Data-parallel encoder on 2 GPUs: the multigpu tests, then the DP benchmark
# (2 GPUs under torchrun against 1 GPU in a single process). Logs and JSON in OUT.
#   bash bench/run_dp.sh [OUT]          (bench/run_gpu.sh's `dp` stage)
# Files: dp_tests.log, dp_tests/cuda-nccl/rank*.json, dp_single.json,
# dp_bench.json, dp_bench_single.log, dp_bench_dp.log, dp_summary.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/gen-mixin-gpu}}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# This machine requires NVLink multicast off (NCCL NVLS, symmetric memory,
# NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NPROC=2
TORCHRUN=(python3 -m torch.distributed.run --standalone --nproc_per_node=$NPROC)
SUMMARY="$OUT/dp_summary.log"
: >"$SUMMARY"
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

ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
echo "GPUs: $ngpu; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE" | tee -a "$SUMMARY"
if [ "${ngpu:-0}" -lt $NPROC ]; then
    echo "run_dp.sh needs $NPROC GPUs" | tee -a "$SUMMARY"
    exit 1
fi

# 1. Correctness over NCCL with CUDA graphs (tiny bf16 towers; set
#    GEN_MIXIN_DP_SIZE=full for the released sizes).
GEN_MIXIN_DP_OUT="$OUT/dp_tests" step dp_tests 330 \
    python3 -m pytest -m multigpu tests/multigpu -v -rA --tb=short -p no:cacheprovider

# 2. Throughput: 16 mixed images, full towers, 1 GPU then 2 GPUs.
step dp_bench_single 300 python3 bench/bench_dp.py --out "$OUT/dp_single.json"
if [ -f "$OUT/dp_single.json" ]; then
    step dp_bench_dp 300 "${TORCHRUN[@]}" bench/bench_dp.py \
        --baseline "$OUT/dp_single.json" --out "$OUT/dp_bench.json"
fi

python3 - "$OUT/dp_bench.json" <<'EOF' | tee -a "$SUMMARY"
import json, sys
try:
    result = json.load(open(sys.argv[1]))
except OSError:
    sys.exit("no dp_bench.json")
comp = result.get("comparison", {})
for stem, v in comp.get("per_stem", {}).items():
    print(f"{stem:14s} 1 GPU {v['single_images_per_s']:7.1f} img/s  "
          f"2 GPU {v['dp_images_per_s']:7.1f} img/s  x{v['ratio']:.2f}  "
          f"outputs {'match' if v['outputs_match_single'] else 'DIFFER'}")
if comp:
    print(f"overall x{comp['overall_ratio']:.2f} "
          f"(target {comp['target_ratio']}x: {'met' if comp['meets_target'] else 'NOT met'})")
EOF
echo "=== dp: status=$status" | tee -a "$SUMMARY"
exit $status
