"""Benchmarks of the package (timings and saved bytes; results under docs/results/bench/). Run from the repository
root as modules, which imports the package from the checkout without installing it:

    python -m benchmarks.bench_quant --device cpu --shapes 64x256 --repeats 2 --out /tmp/quant.json
"""
