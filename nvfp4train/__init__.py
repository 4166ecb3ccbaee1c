"""nvfp4train: NVFP4 / MXFP4 / FP8 pretraining at lab scale."""
