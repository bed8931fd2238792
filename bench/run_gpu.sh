#!/usr/bin/env bash
# One command for a GPU machine: every GPU test and benchmark, logs in $OUT.
#   bash bench/run_gpu.sh [stage...]    stages: smoke tests overhead profile bench dp traffic
#                                       traffic-new launch checks padding traffic-short
#                                       traffic-second traffic-towers traffic-tower-STEM
#                                       tests-beyond traffic-beyond
#   GEN_MIXIN_SMOKE=1 bash bench/run_gpu.sh [stage...]
#       the same stages on the CPU, tiny towers, eager-replay graphs, in seconds
#       (tests are skipped; dp runs its benchmark on 2 gloo processes): checks the
#       scripts, not the numbers.
#
# Stages, their device time on one H200 (from the run summaries in docs/gpu-runs/,
# or estimated: est.), and the files they leave in $OUT besides summary.log and
# <stage>.log:
#   smoke     ~15 s (est.)  versions, one captured varlen attention against eager
#   tests     ~320 s        pytest -m gpu tests/gpu; gpu_summary.jsonl
#   overhead  not recorded  bench_manager_overhead.py; overhead.json
#   profile   not recorded  profile_execute.py; profile.json, profile.txt
#   bench     ~315 s        bench_encoders.py (issue #6 workloads); bench.json, bench.md, bench.png
#   dp        not recorded  2 GPUs (run_dp.sh: multigpu tests, mixed and real-traffic workloads)
#   traffic   ~420 s (est.) bench_traffic.py (issue #17: real-traffic batches, seed models,
#                     default / fine / tuned ladders, vLLM vs cost-aware execution in
#                     interleaved rounds, plans with predicted and measured ms, the
#                     tuner's prediction, issue #6 workloads with cost-aware execution;
#                     24 batches per model, more while the model's share of 300 s
#                     lasts, then a short schedule (3 rounds); 6-8 rounds a batch in
#                     a shuffled order; run A, 2026-12-01: 254 s with 240 s and 3-5
#                     rounds; est. ~330 s now);
#                     traffic.json, traffic.png (markdown from the JSON:
#                     python bench/render_results.py traffic.json --markdown traffic.md;
#                     decisions replayed offline: python bench/replay_traffic.py traffic.json)
#   traffic-new ~195 s (est.) bench_traffic.py --models new: the real-traffic benchmark of
#                     the towers beyond the seed models (InternVL, Kimi-VL, Step3-VL,
#                     Qwen2.5-VL; those without a spec yet are listed as skipped),
#                     without issue #6's workloads; at least 3 batches per model, more
#                     while its share of 80 s lasts, one at most after 100 s. Step3-VL's
#                     two encoder paths: default and fine ladders, vLLM's packing only
#                     (no tuned ladder, no cost-aware policy: n/a (multi-path) in the
#                     JSON). Estimate: InternVL and Kimi-VL ~34 s each (run C,
#                     measured: build, 3 ladders, 3 batches); Step3-VL ~40 s: build ~5 s,
#                     2 ladders of 17 graphs ~7 s each (a warm-up forward per graph: 457
#                     crops and 223 / 191 global views of a 1.5B-parameter ViT, ~7 / ~18
#                     ms each at ~3.6 GFLOP a patch), no calibration or tuning, then its
#                     first 3 batches (36, 2 and 74 crops) ~19 s (eager 0.03-0.6 s, the
#                     default ladder pads 36 crops to 64 and 74 to 128, ~16 calls per
#                     batch); Qwen2.5-VL ~90 s (run C: 45 s to its second ladder, a tuned
#                     ladder to 262k patches, one batch after the hard limit). Over the
#                     ~170 s aim: the set-ups alone, which the limits do not cut, are ~150
#                     s; without Qwen2.5-VL (--models internvl,kimi_vl,step3_vl) ~110 s;
#                     traffic-new.json, traffic-new.png
#   launch    ~90 s         profile_launch.py (issue #17 item 5: execute's host split at 448² and
#                     896² x 8, idle / queued / back-to-back, cudaGraphLaunch per budget,
#                     two passes); launch.json (markdown from the JSON:
#                     python bench/profile_launch.py --render launch.json)
#   checks    ~30 s (est.)  bench_input_checks.py (issue #16 item 6: host time of the mixins'
#                     input checks per item, full towers, pixels on the GPU); checks.json
#   padding   ~60 s (est.)  measure_padding.py (issue #27: DeepSeek-V4.1's full tower, budgets
#                     16384 and 65536 half filled, cu_seqlens closed by one trailing padding
#                     sequence vs zero-length sequences (vLLM's), every item against its own
#                     eager forward, replay and execute medians of 20 rounds); padding.json
#   traffic-short ~190 s (est.) bench_traffic.py on the seed models, the benchmark's workload,
#                     at least 8 batches a model, soft/hard limits 150/190 s, no issue #6
#                     workloads: tuned ladder (vLLM's and cost-aware execution), capture and
#                     calibration seconds per ladder, the tuner's predicted vs measured
#                     waste; traffic-short.json, traffic-short.png
#   traffic-second ~190 s (est.) the same on the second workload (issue #27: other source
#                     shares and batch sizes, --workload second --seed 29, the tuner
#                     trained on seed 30 of it); traffic-second.json, traffic-second.png
#   traffic-tower-STEM  bench_traffic.py on one of the other towered models (STEM:
#                     qwen2_vl, qwen2_5_vl, internvl, kimi_vl, kimi_k25), one process
#                     each, so that no command holds them all (run I's single
#                     traffic-towers process was cut at 560 s inside Kimi-K2.5): one
#                     batch at least, more until 60 s from its start (set-ups are not
#                     cut): capture and calibration seconds per ladder, predicted vs
#                     measured waste of the tuned ladder; traffic-tower-STEM.json.
#                     H100, run I (3 batches, tuned ladders to 4x vLLM's top): set-up
#                     Qwen2-VL 128 s, Qwen2.5-VL 93 s, InternVL 36 s, Kimi-VL 40 s,
#                     Kimi-K2.5 33 s to its tuned ladder; est. now ~140, ~90, ~40, ~50,
#                     ~60 s each with one batch
#   traffic-towers    every traffic-tower-STEM stage above, in that order (~380 s est.)
#   tests-beyond ~260 s (est.) the GPU equivalence suite on the towers beyond vLLM's catalog
#                     (bench_traffic.BEYOND_MODELS, issue #26: Pixtral, Mistral3): tiny and
#                     full, 150 batches each, and the poisoned pool (tiny, 80 batches);
#                     estimate: full ~90 s a model (Mistral-Small-3.1's 24-layer tower, 8
#                     graphs of 64 padded 1540² images, per-image eager references), tiny
#                     ~25 s, poisoned ~15 s; gpu_summary_beyond.jsonl
#   traffic-beyond ~200 s (est.) bench_traffic.py --models beyond: the real-traffic benchmark
#                     on those towers (their processors' resize rules, the tuner given the
#                     host's constants), at least 3 batches a model, limits 60/100 s (set-ups
#                     of the default, fine and tuned ladders, ~50 graphs a model, are not
#                     cut), no issue #6 workloads; traffic-beyond.json, traffic-beyond.png
# Issue #26 on one H100, one call each (under 9 min together, est.):
#   bash bench/run_gpu.sh smoke tests-beyond
#   bash bench/run_gpu.sh traffic-beyond
# Issue #27 on one H100 in two calls under 9 min each:
#   bash bench/run_gpu.sh traffic-short traffic-second
#   bash bench/run_gpu.sh traffic-towers
# `smoke traffic launch` returns 7 files: summary.log, smoke.log, traffic.log,
# traffic.json, traffic.png, launch.log, launch.json.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gen-mixin-gpu}
mkdir -p "$OUT"
stages=${*:-smoke tests overhead}
status=0
cpu=()
# traffic-new's limits (about 150 s at most on one H200); the smoke keeps --quick's.
traffic_new=(--batches 3 --soft-limit-s 80 --hard-limit-s 100)
traffic_short=(--batches 8 --soft-limit-s 150 --hard-limit-s 190 --no-old-workloads)
traffic_tower=(--batches 1 --soft-limit-s 60 --hard-limit-s 60 --no-old-workloads)
towers=(qwen2_vl qwen2_5_vl internvl kimi_vl kimi_k25)
traffic_beyond=(--batches 3 --soft-limit-s 60 --hard-limit-s 100 --no-old-workloads)
padding=()
if [ "${GEN_MIXIN_SMOKE:-0}" = 1 ]; then
    cpu=(--device cpu --size tiny --quick)
    traffic_new=()
    traffic_short=(--no-old-workloads)
    traffic_tower=(--batches 1 --max-batches 1 --no-old-workloads)
    traffic_beyond=(--no-old-workloads)
    padding=(--device cpu --size tiny --quick)
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
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
skip() {  # name
    echo "=== $1: skipped (GEN_MIXIN_SMOKE=1)" | tee -a "$OUT/summary.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/summary.log" 2>&1 \
    || echo "no nvidia-smi" >"$OUT/summary.log"
expanded=()
for stage in $stages; do
    if [ "$stage" = traffic-towers ]; then
        for stem in "${towers[@]}"; do expanded+=("traffic-tower-$stem"); done
    else
        expanded+=("$stage")
    fi
done
for stage in "${expanded[@]}"; do
    case $stage in
        smoke) run smoke python3 bench/gpu_smoke.py ${cpu:+--device cpu} ;;
        tests)
            if [ ${#cpu[@]} -gt 0 ]; then skip tests; continue; fi
            GEN_MIXIN_GPU_SUMMARY="$OUT/gpu_summary.jsonl" run tests \
                python3 -m pytest -m gpu tests/gpu -v -rA --tb=short -p no:cacheprovider ;;
        profile)
            if [ ${#cpu[@]} -gt 0 ]; then
                run profile python3 bench/profile_execute.py --out "$OUT/profile.json" \
                    --text "$OUT/profile.txt" --size tiny --iters 2 --workloads 224x1
            else
                run profile python3 bench/profile_execute.py --out "$OUT/profile.json" \
                    --text "$OUT/profile.txt" --cprofile --kernels --plain
            fi ;;
        overhead) run overhead python3 bench/bench_manager_overhead.py --out "$OUT/overhead.json" \
                   ${cpu:+--device cpu --iters 20 --warmup 2} ;;
        bench) run bench python3 bench/bench_encoders.py --out "$OUT/bench.json" \
                   --markdown "$OUT/bench.md" --plot "$OUT/bench.png" "${cpu[@]}" ;;
        dp)
            if [ ${#cpu[@]} -gt 0 ]; then run dp bash bench/run_dp.sh "$OUT" mixed traffic
            else run dp bash bench/run_dp.sh "$OUT"; fi ;;
        traffic) run traffic python3 bench/bench_traffic.py --out "$OUT/traffic.json" \
                   --plot "$OUT/traffic.png" --soft-limit-s 360 "${cpu[@]}" ;;
        traffic-new) run traffic-new python3 bench/bench_traffic.py --out "$OUT/traffic-new.json" \
                   --plot "$OUT/traffic-new.png" --models new --skip-unusable --no-old-workloads \
                   "${traffic_new[@]}" "${cpu[@]}" ;;
        launch) run launch python3 bench/profile_launch.py --out "$OUT/launch.json" "${cpu[@]}" ;;
        padding) run padding python3 bench/measure_padding.py --out "$OUT/padding.json" \
                   "${padding[@]}" ;;
        traffic-short) run traffic-short python3 bench/bench_traffic.py \
                   --out "$OUT/traffic-short.json" --plot "$OUT/traffic-short.png" \
                   "${traffic_short[@]}" "${cpu[@]}" ;;
        traffic-second) run traffic-second python3 bench/bench_traffic.py --workload second \
                   --seed 29 --out "$OUT/traffic-second.json" --plot "$OUT/traffic-second.png" \
                   "${traffic_short[@]}" "${cpu[@]}" ;;
        traffic-tower-*) run "$stage" python3 bench/bench_traffic.py \
                   --models "${stage#traffic-tower-}" --skip-unusable \
                   --out "$OUT/$stage.json" "${traffic_tower[@]}" "${cpu[@]}" ;;
        tests-beyond)
            if [ ${#cpu[@]} -gt 0 ]; then skip tests-beyond; continue; fi
            # pytest -k over the stems of bench_traffic.BEYOND_MODELS.
            beyond=$(python3 -c 'import sys; sys.path.insert(0, "bench"); import bench_traffic as b; print(" or ".join(b.BEYOND_MODELS))')
            GEN_MIXIN_GPU_SUMMARY="$OUT/gpu_summary_beyond.jsonl" run tests-beyond \
                python3 -m pytest -m gpu tests/gpu/test_equivalence_gpu.py -k "$beyond" \
                -v -rA --tb=short -p no:cacheprovider ;;
        traffic-beyond) run traffic-beyond python3 bench/bench_traffic.py --models beyond \
                   --skip-unusable --out "$OUT/traffic-beyond.json" --plot "$OUT/traffic-beyond.png" \
                   "${traffic_beyond[@]}" "${cpu[@]}" ;;
        checks)
            if [ ${#cpu[@]} -gt 0 ]; then checks=(--device cpu --size tiny --quick)
            else checks=(--device cuda --size full); fi
            run checks python3 bench/bench_input_checks.py --out "$OUT/checks.json" "${checks[@]}" ;;
        *) echo "unknown stage $stage"; status=2 ;;
    esac
done
exit $status
