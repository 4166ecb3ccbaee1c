#!/usr/bin/env bash
# Checks every GPU path and measures the speed tables on a CUDA GPU node (about 10 minutes on an
# H100/H200), from the repository root, in an environment with the project installed:
#
#   bash scripts/gpu_check_all.sh [DIR]      # everything it writes goes to DIR (default runs/gpu_check/)
#
# 1. correctness: the GPU tests of the Triton kernels (bit-exact quantizers, dequantizers, GEMM epilogue;
#    the Mamba conv against F.conv1d; fused norms), the precision checks (scaled_mm's blockwise probe,
#    backend=auto, compiled == eager) and the precision GPU tests;
# 2. speed: benchmarks/bench_quant.py (8192x8192) and benchmarks/bench_train.py on hybrid_1b at seq 4096, compiled with
#    a CUDA graph (the trainer's CUDA defaults): bf16, fp8_tensorwise, fp8_blockwise, nvfp4 and torchao's float8
#    on the blocks fp8_tensorwise quantizes, one row each; with FULL=1 (a few minutes more) also
#    benchmarks/bench_mixer.py (the Mamba conv and norm kernels) and eager rows of hybrid_repro (every precision)
#    and hybrid_350m (bf16 and nvfp4, with --profile: GPU time by kind of kernel).
# Each step has its own time limit, so one that hangs or fails leaves the others their time; the exit
# code is the number of failed steps. DIR gets summary.txt, one log per step in logs/, and the bench rows
# in {quant,train}.json (docs/results/bench/ holds earlier ones). Triton's and Inductor's kernel caches
# (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR; default ~/.cache/nvfp4train/) make a second run start faster.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-runs/gpu_check}
LOGS=$DIR/logs
mkdir -p "$DIR" "$LOGS"
export PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH} WANDB_MODE=disabled PYTHONUNBUFFERED=1
failed=0
step() {  # SECONDS NAME COMMAND...: run it with a limit, its output in $LOGS/NAME.log, a line per step
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || failed=$((failed + 1))
  printf '%-14s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(tail -1 "$LOGS/$name.log")" | tee -a "$DIR/summary.txt"
}
# The 58 GPU tests took more than 240 s one after the other on an H100 (36 had passed by then), most of it Triton
# compiling on the CPU: with pytest-xdist installed six workers share the GPU and the CPU cores.
xdist=(); python3 -c "import xdist" 2>/dev/null && xdist=(-n 6)
step 240 gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu "${xdist[@]}" --durations=10 -rfE \
  tests/formats/test_triton.py tests/formats/test_fp8_tiles.py tests/formats/test_cuda.py tests/model/test_causal_conv.py \
  tests/model/test_fused_norm.py \
  tests/gpu \
  tests/precision/test_cublas_gemm.py tests/precision/test_layer_state.py tests/train/test_cuda_graph.py
step 50 bench_quant python3 -m benchmarks.bench_quant --shapes 8192x8192 --out "$DIR/quant.json"
# the issues' target model at the trainer's CUDA defaults (compiled, CUDA graph): a row takes about 60-70 s on an
# H100 with --profile, most of it compiling (2026-11-25, commit 258b9e2: 104 GPU tests in 157 s, then 3 rows, 372 s)
step 330 bench_1b python3 -m benchmarks.bench_train --models hybrid_1b --seqs 4096 --batch 4 --compile true --cuda-graph true \
  --precisions bf16 fp8_tensorwise fp8_blockwise nvfp4 --torchao fp8_tensorwise --steps 4 --warmup 3 --out "$DIR/train.json"
if [ "${FULL:-0}" = 1 ]; then
  step 40 bench_mixer python3 -m benchmarks.bench_mixer
  step 150 bench_repro python3 -m benchmarks.bench_train --models hybrid_repro --seqs 1024 --batch 32 --compile false \
    --precisions bf16 fp8_tensorwise fp8_blockwise nvfp4 mxfp4 --steps 5 --warmup 3 --out "$DIR/train.json"
  step 120 bench_350m python3 -m benchmarks.bench_train --models hybrid_350m --seqs 2048 --batch 8 --compile false \
    --precisions bf16 nvfp4 --steps 5 --warmup 3 --profile "$DIR/profile" --out "$DIR/train.json"
fi
# with FULL=1 the profile tables are in logs/bench_350m.log
echo "failed steps: $failed"
exit "$failed"
