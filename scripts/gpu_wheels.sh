#!/usr/bin/env bash
# Build `.whl/` for a GPU node without internet access (common on clusters): the pure (or cp312 manylinux)
# wheels nvfp4train needs beyond a CUDA PyTorch image (Python 3.12, torch, triton, tokenizers, safetensors,
# numpy, tqdm, psutil, msgpack, py-cpuinfo, nvidia-ml-py, einops): hydra-core, omegaconf, deepspeed and
# mamba-ssm, built on a machine with PyPI access and copied to the node with the repository.
#
#   bash scripts/gpu_wheels.sh            # writes .whl/ (about 9 MB)
#
# On the GPU node, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# mamba-ssm is built without its CUDA extension (Triton kernels only); nvfp4train imports its Triton
# SSD without importing the package's __init__ (see nvfp4train/model/ops/mamba_kernels.py).
set -euo pipefail
cd "$(dirname "$0")/.."
wheel_dir=.whl
mkdir -p "$wheel_dir"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || grep -qx '/.whl/' .gitignore || echo '/.whl/' >> .git/info/exclude

binary() {  # wheels as published, for the GPU machine's Python
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$wheel_dir" "$@"
}
binary hydra-core==1.3.2 omegaconf==2.3.0 hjson==3.1.0 \
  pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2
# for scripts/gpu_check_all.sh: the GPU tests spend most of their time compiling Triton kernels on the
# CPU, one test after the other; pytest-xdist spreads them over the machine's 16 cores
binary pytest-xdist==3.8.0 execnet==2.1.2
# for bench_train.py --torchao (torchao's float8 training beside ours: Python on top of torch.compile, its C++
# extensions unused; 3.4 MB): it ran on the GPU machine's torch 2.11 (2026-11-25)
binary torchao==0.18.0
# sdist-only packages, built here into pure wheels
python3 -m pip wheel -q --no-deps -w "$wheel_dir" antlr4-python3-runtime==4.9.3
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w "$wheel_dir" deepspeed==0.19.8
MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE python3 -m pip wheel -q --no-deps --no-build-isolation \
  -w "$wheel_dir" mamba-ssm==2.3.2.post1
ls -la "$wheel_dir"
du -sh "$wheel_dir"
