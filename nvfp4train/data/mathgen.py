"""DeepMind's mathematics-dataset generator (PyPI `mathematics-dataset`, Apache-2.0), run offline.

It is installed into a work folder and run in a subprocess with only its packages on PYTHONPATH, so
nothing enters the environment. Two shims make the 2019 generator run on current numpy and sympy
(`np.object`, and `base_solution_linear`, which moved into `sympy.solvers.diophantine.diophantine`), and two
make it reproducible: `seed_all(k)` seeds the three generators it draws from (Python's, numpy's and sympy's
own, which `randprime` uses), and `expand_entities` lists a question's entities in the order they were made
instead of through a set of objects hashed by address (which differs from process to process).
Used by scripts/build_corpora.py (the math training domain) and evals/build_tasks.py (arithmetic).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# sympy and mpmath pinned too: the generated text depends on their versions (numpy's legacy seeded stream does not)
PACKAGES = ["mathematics-dataset==1.0.1", "absl-py==2.5.1", "six==1.17.0", "sympy==1.14.0", "mpmath==1.3.0"]
# Run before a caller's script body: the shims, then `generate` and `modules` are in scope.
PRELUDE = r"""
import importlib, json, random, sys
import numpy as np
np.object = object
importlib.import_module("sympy.solvers.diophantine")
sys.modules["sympy.solvers.diophantine"].base_solution_linear = importlib.import_module(
    "sympy.solvers.diophantine.diophantine").base_solution_linear
from absl import flags
flags.FLAGS(["generate"])
from mathematics_dataset import generate
from mathematics_dataset.modules import modules
from mathematics_dataset.util import composition
import six
import sympy.core.random


def seed_all(k):
    random.seed(k)
    np.random.seed(k)
    sympy.core.random.seed(k)


def _expand_entities_in_order(context, **kwargs):
    kwargs = kwargs.copy()
    entities = dict.fromkeys(context.child_entities)
    for key, maybe_entity in six.iteritems(kwargs):
        if isinstance(maybe_entity, composition.Entity):
            entities[maybe_entity] = None
            kwargs[key] = maybe_entity.handle
    entities = list(entities)
    random.shuffle(entities)
    child_descriptions = []
    for entity in entities:
        child_descriptions.append(entity.child_description)
        if not entity.expression_used:
            child_descriptions.append(entity.description)
    return " ".join([s for s in child_descriptions if s]), kwargs


composition.expand_entities = _expand_entities_in_order
"""


def run(workdir: Path, body: str, *args: str) -> list[dict]:
    """Run PRELUDE + `body` (which prints one JSON object per line) with `args` as sys.argv[1:]."""
    deps = Path(workdir) / "math_deps"
    if not (deps / "mathematics_dataset").is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(deps), *PACKAGES],
            check=True,
        )
    env = {**os.environ, "PYTHONPATH": str(deps), "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + body, *args], env=env, check=True, capture_output=True, text=True
    )
    return [json.loads(line) for line in out.stdout.splitlines()]
