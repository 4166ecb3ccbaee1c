"""The launcher: `python -m nvfp4train.launch [torchrun options] -m nvfp4train.train [overrides]` is torchrun whose
failures end in one line and the failing rank's exit code (`torchrun.py`); `errors.py` is the one-line refusal a
rank records for it; `processes.py` ends a launched job with every process under it. The process groups and the
data-parallel wrappers the workers use are `nvfp4train.parallel`."""
