#!/usr/bin/env bash
# Transformer Engine 2.20.2 (PyTorch) on a CUDA GPU node (H100/H200: TE's FP8 recipes; NVFP4 needs
# Blackwell), installed into the active Python environment and checked against nvfp4train's emulated path.
# From the repository root:
#   bash scripts/te_on_gpu.sh download         # the core wheel (cu13), the meta wheel and the
#                                              # transformer_engine_torch sdist into $TE_DOWNLOADS
#                                              # (default ~/.cache/nvfp4train/te), checked by SHA-256;
#                                              # on a node without internet access, run it where there is
#                                              # some and point TE_DOWNLOADS at the same files on the node
#   bash scripts/te_on_gpu.sh install          # install the wheels and build transformer_engine_torch
#                                              # (a C++ torch extension; PyPI has no wheel of it) here
#   bash scripts/te_on_gpu.sh check            # import TE, one te.Linear FP8 step per recipe, GPU tests
#   bash scripts/te_on_gpu.sh train N [DIR]    # hybrid_125m per FP8 recipe: te vs emulated (2 seeds), N
#                                              # steps each, all at once; python -m nvfp4train.compare
# docs/results/te.md has what these gave on an H100.
set -euo pipefail
cd "$(dirname "$0")/.."

TE_VERSION=2.20.2
CORE_WHEEL=transformer_engine_cu13-${TE_VERSION}-py3-none-manylinux_2_28_x86_64.whl
CORE_SHA=30063d3699e779cce63617c3458804f7a504ce8279f2749c98313db9daae273e
CORE_URL=https://files.pythonhosted.org/packages/20/1e/8f51aefcfec3cf7dc9dd3e28084ea6131fec020ef233ebd0532ee08cbc28/$CORE_WHEEL
META_WHEEL=transformer_engine-${TE_VERSION}-py3-none-any.whl
META_SHA=7dcfad943a1a55b2612db9a0e43697fe98c70f4c42ec391ba3a0f872f6ce2094
META_URL=https://files.pythonhosted.org/packages/28/f7/46d701a17b9d6124cbc1abd31c336e0c12eefeede7f7386a4e999fe6a254/$META_WHEEL
SDIST=transformer_engine_torch-${TE_VERSION}.tar.gz
SDIST_SHA=4c40ced8a6261649e689076f198d4feaf02277b1ba18931a66eccdaceb33c43e
SDIST_URL=https://files.pythonhosted.org/packages/3d/fb/c9ce298a38c22ed1059923a01cac7e1f4e4f7281d39a8679c8118febe079/$SDIST

BUILD_DIR=${TMPDIR:-/tmp}/te_build
DOWNLOADS=${TE_DOWNLOADS:-$HOME/.cache/nvfp4train/te}

say() { echo "[te_on_gpu $(date +%H:%M:%S)] $*"; }
die() { echo "te_on_gpu: $*" >&2; exit 2; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }
check_sha() {  # file expected
  local got; got=$(sha_of "$1")
  [ "$got" = "$2" ] || die "$1: sha256 $got, expected $2"
}
fetch() {  # url sha -> $DOWNLOADS/<name>, verified
  local name; name=$(basename "$1")
  mkdir -p "$DOWNLOADS"
  if [ ! -f "$DOWNLOADS/$name" ] || [ "$(sha_of "$DOWNLOADS/$name")" != "$2" ]; then
    say "downloading $name"
    curl -fsSL -o "$DOWNLOADS/$name.part" "$1" || die "cannot download $1 (no internet access here? run download where there is some, then set TE_DOWNLOADS)"
    mv "$DOWNLOADS/$name.part" "$DOWNLOADS/$name"
  fi
  check_sha "$DOWNLOADS/$name" "$2"
}
download() {
  fetch "$CORE_URL" "$CORE_SHA"
  fetch "$META_URL" "$META_SHA"
  fetch "$SDIST_URL" "$SDIST_SHA"
  say "in $DOWNLOADS: $CORE_WHEEL, $META_WHEEL, $SDIST"
}

include_dir_of() {  # header -> the nvidia/*/include dir of torch's pip CUDA libraries holding it
  python3 - "$1" <<'EOF'
import glob, os, sys, sysconfig
roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
try:
    import nvidia
    roots.update(os.path.dirname(p) for p in nvidia.__path__)
except ImportError:
    pass
for root in sorted(roots):
    for hit in sorted(glob.glob(os.path.join(root, "nvidia", "**", "include", sys.argv[1]), recursive=True)):
        print(hit[: -len(sys.argv[1]) - 1])  # the include dir (header may be nvtx3/nvToolsExt.h)
        sys.exit(0)
EOF
}

install() {  # the core and meta wheels into this environment, then transformer_engine_torch built here
  local t0 t1 t2
  t0=$(date +%s)
  download
  python3 -m pip install -q --no-deps --no-index "$DOWNLOADS/$CORE_WHEEL" "$DOWNLOADS/$META_WHEEL"
  t1=$(date +%s)
  # its .so lives in transformer_engine/wheel_lib/ (imported by transformer_engine.pytorch), so ask pip's record
  if python3 -c "import sys; from importlib.metadata import version; sys.exit(version('transformer_engine_torch') != sys.argv[1])" \
      "$TE_VERSION" 2>/dev/null; then
    say "transformer_engine_torch $TE_VERSION already installed"
    return
  fi
  command -v nvcc >/dev/null || export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
  command -v nvcc >/dev/null || die "no nvcc on PATH or in \$CUDA_HOME/bin (TE's build reads the CUDA version and headers from it)"
  # The torch extension is C++ only (CppExtension: no nvcc pass, so no GPU architectures to restrict);
  # NVTE_CUDA_ARCHS=90 only keeps build_tools' NCCL-EP switch on (it wants an arch >= 90), as the
  # published core was built with it. build_tools puts only the toolkit's include dir (next to nvcc)
  # on the compiler's path; the headers below that it lacks (cudnn.h and nccl.h at least: torch's pip
  # wheels hold them) are taken from site-packages/nvidia/*/include, after the toolkit's.
  local toolkit_inc header dir
  toolkit_inc=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")/include
  for header in cudnn.h nccl.h cublas_v2.h cublasLt.h nvrtc.h cuda_runtime_api.h nvtx3/nvToolsExt.h; do
    [ -f "$toolkit_inc/$header" ] && continue
    dir=$(include_dir_of $header)
    if [ -n "$dir" ]; then
      case ":${CPLUS_INCLUDE_PATH:-}:" in *":$dir:"*) ;; *) export CPLUS_INCLUDE_PATH=${CPLUS_INCLUDE_PATH:+$CPLUS_INCLUDE_PATH:}$dir ;; esac
    else
      say "warning: $header is in neither $toolkit_inc nor site-packages/nvidia; the build may fail"
    fi
  done
  export NVTE_PYTORCH_FORCE_BUILD=TRUE   # build it here rather than fetch a prebuilt wheel
  export NVTE_NO_LOCAL_VERSION=1         # version 2.20.2, not 2.20.2+<git commit of a surrounding repo>
  export NVTE_CUDA_ARCHS=90 NVTE_FRAMEWORK=pytorch MAX_JOBS=${MAX_JOBS:-16}
  rm -rf "$BUILD_DIR" && mkdir -p "$BUILD_DIR"
  tar -C "$BUILD_DIR" -xzf "$DOWNLOADS/$SDIST"
  say "building transformer_engine_torch (MAX_JOBS=$MAX_JOBS, CPLUS_INCLUDE_PATH=${CPLUS_INCLUDE_PATH:-})"
  local log=$BUILD_DIR/te_build.log
  (cd "$BUILD_DIR/transformer_engine_torch-$TE_VERSION" &&
   python3 -m pip wheel -v --no-deps --no-build-isolation --no-index -w "$BUILD_DIR/dist" . > "$log" 2>&1) \
    || { tail -60 "$log"; die "the build of transformer_engine_torch failed (log: $log)"; }
  grep -E "^\[[0-9]+/[0-9]+\]|error|warning: " "$log" | tail -5 || true
  local wheel; wheel=$(ls "$BUILD_DIR"/dist/transformer_engine_torch-*.whl)
  python3 -m pip install -q --no-deps --no-index "$wheel"
  t2=$(date +%s)
  say "seconds: core $((t1 - t0)), torch extension $((t2 - t1)), total $((t2 - t0))"
}


check() {
  local t0; t0=$(date +%s)
  python3 - <<'EOF'
import time
t = time.time()
import torch
import transformer_engine
import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from importlib.metadata import version
print(f"import {time.time() - t:.1f}s; torch {torch.__version__}, "
      f"{torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}; "
      + ", ".join(f"{p} {version(p)}" for p in ("transformer_engine", "transformer_engine_cu13", "transformer_engine_torch")))
print("fp8:", te.is_fp8_available(), "| fp8 block scaling:", te.is_fp8_block_scaling_available())
layer = te.Linear(256, 256, bias=False, params_dtype=torch.float32, device="cuda")
x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
with torch.no_grad():
    ref = x.float() @ layer.weight.float().t()
for r in (recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID), recipe.Float8BlockScaling(fp8_format=recipe.Format.E4M3)):
    with torch.autocast("cuda", dtype=torch.bfloat16), te.autocast(enabled=True, recipe=r):
        y = layer(x)
    y.float().square().mean().backward()
    torch.cuda.synchronize()
    err = ((y.float() - ref).norm() / ref.norm()).item()
    print(f"{type(r).__name__}: y {tuple(y.shape)} {y.dtype}, rel err vs fp32 {err:.3g}, "
          f"|dW| {layer.weight.grad.norm().item():.3g}, |dX| {x.grad.norm().item():.3g}")
    assert err < 0.1 and torch.isfinite(layer.weight.grad).all()
    layer.weight.grad = x.grad = None
print("TE OK")
EOF
  say "TE smoke test: $(( $(date +%s) - t0 ))s; now the GPU tests"
  local rc=0
  python3 -m pytest -q -p no:cacheprovider -rs tests/precision/test_te.py \
    "tests/gpu/test_precision_gpu.py::test_gpu_check[check_te]" 2>&1 | tail -40 || rc=$?
  say "check: $(( $(date +%s) - t0 ))s, pytest exit $rc"
  return $rc
}

train() {  # N [DIR]: hybrid_125m, te vs emulated (two seeds: the emulated path's own spread), N steps
  # each, for every precision in $TE_PRECISIONS (default: both FP8 recipes), all runs at once on this
  # GPU (the comparison needs loss curves, not speeds), then python -m nvfp4train.compare per precision
  local steps=${1:-100} runs_dir=${2:-/tmp/te_train} precisions=(${TE_PRECISIONS:-fp8_blockwise fp8_tensorwise})
  local common=(model=hybrid_125m "train.max_steps=$steps" train.log_every=1 train.eval_every=50
                train.progress=false train.seq_len=1024 train.global_batch_size=16)
  mkdir -p "$runs_dir"
  local t0 pids=() names=(); t0=$(date +%s)
  for p in "${precisions[@]}"; do
    for arm in te:1 emulated:1 emulated:2; do
      local backend=${arm%:*} seed=${arm#*:} dir="$runs_dir/$p/${arm%:*}_seed${arm#*:}"
      mkdir -p "$dir"
      python3 -m nvfp4train.train "out_dir=$dir" "precision=$p" "precision.backend=$backend" "seed=$seed" \
        "${common[@]}" > "$dir.log" 2>&1 &
      pids+=($!); names+=("$dir")
    done
  done
  say "training ${#pids[@]} runs at once, $steps steps each"
  local i rc=0
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { rc=1; tail -20 "${names[$i]}.log"; say "FAILED: ${names[$i]}"; }
  done
  say "trained in $(( $(date +%s) - t0 ))s"
  for p in "${precisions[@]}"; do
    python3 -m nvfp4train.compare "$runs_dir/$p/emulated_seed1" "$runs_dir/$p/emulated_seed2" "$runs_dir/$p/te_seed1" \
      --baseline "$runs_dir/$p/emulated_seed1" --out "$runs_dir/$p/compare" || rc=1
    cat "$runs_dir/$p/compare/compare.md" 2>/dev/null | sed -n '/Gaps at milestones/,/Stability/p'
  done
  return $rc
}

cmd=${1:-}; shift || true
case "$cmd" in
  download) download ;;
  install) install ;;
  check) check ;;
  train) train "$@" ;;
  *) die "usage: bash scripts/te_on_gpu.sh download | install | check | train N [DIR]" ;;
esac
