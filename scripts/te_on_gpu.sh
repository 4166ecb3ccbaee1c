#!/usr/bin/env bash
# Bring Transformer Engine 2.20.2 (PyTorch) to a GPU machine without network, build it there, prove it.
#
# Here (a machine with PyPI access), from the repository root:
#   bash scripts/te_on_gpu.sh prepare          # .te/base (sdist + meta wheel, 1.7 MB) and
#                                              # .te/sm90/core_sm90.tar.xz (26 MB): route 2, the default
#   bash scripts/te_on_gpu.sh prepare --parts  # also .te/parts/part1..6 (the untouched 276 MB core wheel
#                                              # in 6 pieces of 44 MiB): route 1, the fallback
# On the GPU machine (H100/H200, sm_90), from the repository root (docs/results/te.md: the exact calls):
#   bash scripts/te_on_gpu.sh part K           # route 1: keep part K under /tmp/te_parts; once all
#                                              # 6 are there, join them and check the wheel's sha256
#   bash scripts/te_on_gpu.sh build [sm90|wheel]  # core into /tmp/te_site (sm90: route 2, the default when
#                                              # .te/sm90 came along; wheel: route 1's joined wheel), then
#                                              # build transformer_engine_torch; a no-op once done
#   bash scripts/te_on_gpu.sh check            # import TE, one te.Linear FP8 step per recipe, GPU tests
#   bash scripts/te_on_gpu.sh train N [DIR]    # hybrid_125m per FP8 recipe: te vs emulated (2 seeds), N
#                                              # steps each, all at once; python -m nvfp4train.compare
# Every GPU-side step sets PYTHONPATH=/tmp/te_site:/tmp/site (/tmp/site: the .whl wheels, installed here
# when .whl/ came along) and prints its seconds.
#
# Why two routes: one device call carries at most 64 MiB of the tree, the machine has no network and is
# given back 30 s after a call ends. The core wheel is 276 MB, almost all of it CUDA code for 8 GPU
# architectures; scripts/te_prune_fatbin.py keeps only the sm_90 code (18 of 263 MB) in
# libtransformer_engine.so, so the whole installed core fits one call (route 2). Route 1 carries the
# wheel as published, in 6 consecutive calls. transformer_engine_torch has no wheel on PyPI: its sdist
# (a C++ torch extension, no CUDA code, linked at import against the core library) is built there.
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
# libtransformer_engine.so after `te_prune_fatbin.py --keep-arch 90` (deterministic: same input, same bytes)
PRUNED_SO_SHA=be969bfde2ec1220fe7be54c26ff8e7e9e7c7362614b18189bfaffa27366234d
NPARTS=6

SITE=/tmp/te_site            # where TE lives on the GPU machine
PARTS_DIR=/tmp/te_parts      # route 1's pieces, joined there
BUILD_DIR=/tmp/te_build
DOWNLOADS=${TE_DOWNLOADS:-/tmp/te}   # prepare's download cache (here)

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
    curl -fsSL -o "$DOWNLOADS/$name.tmp" "$1"
    mv "$DOWNLOADS/$name.tmp" "$DOWNLOADS/$name"
  fi
  check_sha "$DOWNLOADS/$name" "$2"
}

prepare() {
  local parts=0
  [ "${1:-}" = "--parts" ] && parts=1
  grep -qx '/.te/' .gitignore || die ".gitignore must list /.te/ (so .te/ never travels unless carried)"
  fetch "$CORE_URL" "$CORE_SHA"
  fetch "$META_URL" "$META_SHA"
  fetch "$SDIST_URL" "$SDIST_SHA"
  rm -rf .te && mkdir -p .te/base .te/sm90
  cp "$DOWNLOADS/$META_WHEEL" "$DOWNLOADS/$SDIST" .te/base/

  # Route 2: the core as pip would install it (core + meta wheel: the meta wheel's dist-info is what
  # transformer_engine's version checks look for), with the sm_90 code only, as one .tar.xz.
  local stage; stage=$(mktemp -d /tmp/te_stage.XXXXXX)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$stage/site" \
    "$DOWNLOADS/$CORE_WHEEL" "$DOWNLOADS/$META_WHEEL"
  local so="$stage/site/transformer_engine/wheel_lib/libtransformer_engine.so"
  python3 scripts/te_prune_fatbin.py "$so" --keep-arch 90
  check_sha "$so" "$PRUNED_SO_SHA"
  say "compressing the sm_90 core (xz, about 1.5 min on 2 cores)"
  tar -C "$stage/site" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . \
    | xz -6 -T2 > .te/sm90/core_sm90.tar.xz
  rm -rf "$stage"

  if [ "$parts" = 1 ]; then  # Route 1: the published wheel, split evenly
    mkdir -p .te/parts
    split -n "$NPARTS" -d -a 1 --numeric-suffixes=1 "$DOWNLOADS/$CORE_WHEEL" .te/parts/part
  fi
  (cd .te && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum > base/SHA256SUMS)
  cat .te/base/SHA256SUMS
  du -ab .te | sort -k2
}

part() {  # K
  local k=${1:?part number 1..$NPARTS}
  [ -f ".te/parts/part$k" ] || die ".te/parts/part$k is not here: carry [\".te/parts/part$k\"]"
  mkdir -p "$PARTS_DIR"
  cp ".te/parts/part$k" "$PARTS_DIR/part$k"
  local have; have=$(ls "$PARTS_DIR" | grep -c '^part[0-9]$' || true)
  say "part $k kept ($have of $NPARTS here)"
  if [ "$have" = "$NPARTS" ]; then
    cat $(for i in $(seq 1 $NPARTS); do echo "$PARTS_DIR/part$i"; done) > "$PARTS_DIR/$CORE_WHEEL"
    check_sha "$PARTS_DIR/$CORE_WHEEL" "$CORE_SHA"
    rm -f "$PARTS_DIR"/part[0-9]
    say "joined: $PARTS_DIR/$CORE_WHEEL, sha256 ok"
  fi
}

use_site() {  # PYTHONPATH for TE and, when .whl/ came along, the project's wheels
  if [ ! -d /tmp/site ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  export PYTHONPATH=$SITE:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
}

install_core() {  # [sm90|wheel]: the route (default: sm90 when .te/sm90 came along, else the joined wheel)
  local route=${1:-auto}
  if [ -f "$SITE/transformer_engine/wheel_lib/libtransformer_engine.so" ]; then
    say "core already in $SITE"
    return
  fi
  [ -f .te/base/$SDIST ] || die ".te/base is not here: carry [\".te/base\", ...] (bash scripts/te_on_gpu.sh prepare makes it)"
  (cd .te && sha256sum --quiet -c base/SHA256SUMS --ignore-missing) || die ".te/ does not match .te/base/SHA256SUMS"
  mkdir -p "$SITE"
  if [ "$route" = auto ]; then
    route=wheel; [ -f .te/sm90/core_sm90.tar.xz ] && route=sm90
  fi
  if [ "$route" = sm90 ]; then
    [ -f .te/sm90/core_sm90.tar.xz ] || die ".te/sm90 is not here: carry [\".te/base\", \".te/sm90\", ...]"
    say "route 2: unpacking the sm_90 core into $SITE"
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
      .te/sm90/core_sm90.tar.xz "$SITE"
    check_sha "$SITE/transformer_engine/wheel_lib/libtransformer_engine.so" "$PRUNED_SO_SHA"
  elif [ -f "$PARTS_DIR/$CORE_WHEEL" ]; then
    say "route 1: installing the joined core wheel (all architectures) into $SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
      "$PARTS_DIR/$CORE_WHEEL" ".te/base/$META_WHEEL"
  else
    die "no core: carry .te/sm90 (route 2) or first send all $NPARTS parts (route 1)"
  fi
  if command -v cuobjdump >/dev/null; then  # the CUDA code the GPU will load, as CUDA's own tool reads it
    cuobjdump --list-elf "$SITE/transformer_engine/wheel_lib/libtransformer_engine.so" \
      | sed -E 's/.*\.(sm_[0-9a-z]+)\..*/\1/' | sort | uniq -c
  fi
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

build() {  # [sm90|wheel]
  local t0 t1 t2
  t0=$(date +%s)
  install_core "${1:-auto}"
  t1=$(date +%s)
  if ls "$SITE"/transformer_engine/wheel_lib/transformer_engine_torch*.so >/dev/null 2>&1; then
    say "transformer_engine_torch already built"
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
  export NVTE_PYTORCH_FORCE_BUILD=TRUE   # skip setup.py's download of a prebuilt wheel (no network)
  export NVTE_NO_LOCAL_VERSION=1         # version 2.20.2, not 2.20.2+<git commit of a surrounding repo>
  export NVTE_CUDA_ARCHS=90 NVTE_FRAMEWORK=pytorch MAX_JOBS=${MAX_JOBS:-16}
  rm -rf "$BUILD_DIR" && mkdir -p "$BUILD_DIR"
  tar -C "$BUILD_DIR" -xzf ".te/base/$SDIST"
  say "building transformer_engine_torch (MAX_JOBS=$MAX_JOBS, CPLUS_INCLUDE_PATH=${CPLUS_INCLUDE_PATH:-})"
  local log=${OUT:-$BUILD_DIR}/te_build.log  # the device tool brings $OUT back: the whole log on a failure
  (cd "$BUILD_DIR/transformer_engine_torch-$TE_VERSION" &&
   python3 -m pip wheel -v --no-deps --no-build-isolation --no-index -w "$BUILD_DIR/dist" . > "$log" 2>&1) \
    || { tail -60 "$log"; die "the build of transformer_engine_torch failed (log: $log)"; }
  grep -E "^\[[0-9]+/[0-9]+\]|error|warning: " "$log" | tail -5 || true
  local wheel; wheel=$(ls "$BUILD_DIR"/dist/transformer_engine_torch-*.whl)
  # Unzipped, not pip-installed: pip --target would replace the transformer_engine/ folder the core
  # is in (the extension's wheel puts its .so into transformer_engine/wheel_lib/ too).
  python3 -m zipfile -e "$wheel" "$SITE"
  t2=$(date +%s)
  ls -la "$SITE"/transformer_engine/wheel_lib/
  say "seconds: core $((t1 - t0)), torch extension $((t2 - t1)), total $((t2 - t0))"
}

check() {
  use_site
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
  use_site
  local steps=${1:-100} out=${2:-/tmp/te_train} precisions=(${TE_PRECISIONS:-fp8_blockwise fp8_tensorwise})
  local common=(model=hybrid_125m "train.max_steps=$steps" train.log_every=1 train.eval_every=50
                train.progress=false train.seq_len=1024 train.global_batch_size=16)
  mkdir -p "$out"
  local t0 pids=() names=(); t0=$(date +%s)
  for p in "${precisions[@]}"; do
    for arm in te:1 emulated:1 emulated:2; do
      local backend=${arm%:*} seed=${arm#*:} dir="$out/$p/${arm%:*}_seed${arm#*:}"
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
    python3 -m nvfp4train.compare "$out/$p/emulated_seed1" "$out/$p/emulated_seed2" "$out/$p/te_seed1" \
      --baseline "$out/$p/emulated_seed1" --out "$out/$p/compare" || rc=1
    cat "$out/$p/compare/compare.md" 2>/dev/null | sed -n '/Gaps at milestones/,/Stability/p'
  done
  if [ -n "${OUT:-}" ]; then  # one archive (the device tool brings back 8 files at most): re-plot here
    (cd "$out" && tar czf "$OUT/te_train.tar.gz" */*/config.yaml */*/metrics.jsonl */*.log */compare/compare.md \
      */compare/compare.json */compare/*.png) || rc=1
  fi
  return $rc
}

cmd=${1:-}; shift || true
case "$cmd" in
  prepare) prepare "$@" ;;
  part) part "$@" ;;
  build) build "$@" ;;
  check) check ;;
  train) train "$@" ;;
  *) die "usage: bash scripts/te_on_gpu.sh prepare [--parts] | part K | build [sm90|wheel] | check | train N [DIR]" ;;
esac
