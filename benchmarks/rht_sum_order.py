"""How often the order of the 16-point RHT's sum shows in its bits, on a trained model's Wgrad operands.

    python -m benchmarks.rht_sum_order RUN_DIR                 # a finished run's latest checkpoint
    python -m benchmarks.rht_sum_order RUN_DIR --seq 256 --batch 8 --step 300
    python -m benchmarks.rht_sum_order --golden-only        # the TE golden vectors under each order

``hadamard.rht`` (TE's reference) sums the 16 products of an output in index order, rounding to FP32
after each addition, then rounds to the input's dtype. A faster kernel would sum in another order: a
Walsh-Hadamard butterfly (4 additions an element instead of 16 multiply-adds) or a tensor-core product.
This script takes one forward and backward pass of RUN_DIR's model (BF16 autocast, on CPU, sequences of
the bundled validation corpus), keeps every linear's input x and output gradient dY (the head excepted:
the recipe keeps it in BF16), and transforms each along tokens as the Wgrad operand is transformed. Per
operand it prints how many BF16 elements of the transform differ from the reference when the sum is

- exact, rounded once (in FP64, then FP32, then BF16): what any order gives where no partial sum rounds;
- a butterfly in FP32 (x/4, exact for BF16 input, then 4 stages of additions and subtractions).

and the share of 16-token columns whose nonzero exponents spread more than 12 binades (or reach the
subnormal range), the columns where a sum of 16 BF16 values may round at all in FP32 (a sum of 16 values
of 8 significant bits within 12 binades needs at most 24 bits). Last, how many of Transformer Engine's
golden NVFP4 cases with the RHT (tests/formats/golden/te_nvfp4_reference) each order reproduces, every
code and scale byte of the columnwise quantization.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def butterfly(blocks: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """The transform of FP32 blocks [n, 16] by a Sylvester butterfly: the same matrix as
    hadamard.rht_matrix(16, signs) (s_i (-1)^popcount(i & j) / 4), another order of additions."""
    y = blocks * (signs / 4)  # exact: a power-of-two scale
    h = 1
    while h < y.shape[1]:
        y = y.view(-1, y.shape[1] // (2 * h), 2, h)
        y = torch.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), dim=2).reshape(blocks.shape)
        h *= 2
    return y


def operands(run_dir: Path, seq: int, batch: int, step: int | None) -> dict[str, torch.Tensor]:
    """{linear/x or linear/dy: [tokens, features] BF16} from one forward and backward pass."""
    from nvfp4train.data.tokenizer import HFTokenizer
    from nvfp4train.eval.weights import load_run_model

    model, _, _ = load_run_model(run_dir, step)
    model.train()
    tokenizer = HFTokenizer(REPO / "data" / "tokenizer" / "bpe8k.json")
    need = seq * batch + 1
    sources = sorted((REPO / "data" / "bundled").glob("*.val.jsonl.gz"))
    ids: list[int] = []
    for path in sources:  # an equal share of the sequences' tokens from each source
        share: list[int] = []
        with gzip.open(path, "rt") as lines:
            for line in lines:
                share += tokenizer.encode(json.loads(line)["text"])
                if len(share) >= need // len(sources) + 1:
                    break
        ids += share[: need // len(sources) + 1]
    if len(ids) < need:
        sys.exit(f"rht_sum_order: the bundled validation corpus has {len(ids)} tokens, fewer than {need}")
    tokens = torch.tensor(ids[:need])
    x, y = tokens[:-1].view(batch, seq), tokens[1:].view(batch, seq)
    captured: dict[str, torch.Tensor] = {}

    def keep(name: str, t: torch.Tensor) -> None:
        captured[name] = t.detach().to(torch.bfloat16).reshape(-1, t.shape[-1])

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            module.register_forward_hook(lambda m, i, o, name=name: keep(f"{name}/x", i[0]))
            module.register_full_backward_hook(lambda m, gi, go, name=name: keep(f"{name}/dy", go[0]))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
    return captured


def spread_share(t: torch.Tensor) -> float:
    """Share of (16-token group, feature) columns of t [tokens, features] whose nonzero BF16 exponents
    spread more than 12 binades or reach the subnormal range."""
    exponent = (t.view(torch.int16).to(torch.int32) >> 7) & 0xFF
    nonzero = (t != 0).view(-1, 16, t.shape[1])
    exponent = exponent.view(-1, 16, t.shape[1])
    top = torch.where(nonzero, exponent, -1).amax(1)
    bottom = torch.where(nonzero, exponent, 999).amin(1)
    wide = (top >= 0) & ((top - bottom > 12) | (bottom < 4))
    return float(wide.float().mean())


def sum_orders() -> dict:
    """{order: the 16-point transform of blocks [n, 16] in their dtype}: the reference's index order, the
    exact sum rounded once, an FP32 butterfly."""
    from nvfp4train.formats import hadamard

    signs = hadamard.resolve_signs(16).to(torch.float32)
    matrix = hadamard.rht_matrix(16, dtype=torch.float64)
    return {
        "reference": lambda b: hadamard.rht(b, 16, impl="reference"),
        "exact sum": lambda b: (b.double() @ matrix).float().to(b.dtype),
        "FP32 butterfly": lambda b: butterfly(b.float(), signs).to(b.dtype),
    }


def golden_cases_reproduced() -> dict[str, tuple[int, int]]:
    """{order: (golden RHT cases whose columnwise codes and scales it reproduces, cases)}."""
    from safetensors.torch import load_file

    from nvfp4train.formats import nvfp4

    golden = REPO / "tests" / "formats" / "golden" / "te_nvfp4_reference"
    manifest = json.loads((golden / "manifest.json").read_text())
    tensors = load_file(str(golden / "cases.safetensors"))
    orders = sum_orders()
    counts = {order: [0, 0] for order in orders}
    for case in manifest["cases"]:
        if case["format"] != "nvfp4" or not case["rht_on_columnwise"]:
            continue
        name, tile = case["name"], tuple(case["tile"])
        xt = tensors[f"{name}/x"].t().contiguous()
        for order, transform in orders.items():
            q = nvfp4.quantize(transform(xt.reshape(-1, 16)).reshape(xt.shape), tile=tile)
            same = torch.equal(q.codes, tensors[f"{name}/columnwise_codes"]) and torch.equal(
                q.scales.view(torch.uint8), tensors[f"{name}/columnwise_scales_e4m3"]
            )
            counts[order][0] += int(same)
            counts[order][1] += 1
    return {order: (done, total) for order, (done, total) in counts.items()}


def operand_table(args) -> None:
    reference, exact, fast = sum_orders().values()
    print("| operand | tokens x features | wide columns | differ: exact sum | differ: FP32 butterfly |")
    print("|---|---|---|---|---|")
    totals = [0, 0, 0]
    for name, t in sorted(operands(args.run_dir, args.seq, args.batch, args.step).items()):
        blocks = t.t().contiguous().reshape(-1, 16)  # [features, tokens]: the Wgrad transform runs along tokens
        want = reference(blocks)
        n_exact, n_fast = (
            int((order(blocks).view(torch.int16) != want.view(torch.int16)).sum()) for order in (exact, fast)
        )
        totals = [totals[0] + want.numel(), totals[1] + n_exact, totals[2] + n_fast]
        print(
            f"| {name} | {t.shape[0]} x {t.shape[1]} | {spread_share(t):.2%} | {n_exact} | {n_fast} |",
            flush=True,
        )
    n, n_exact, n_fast = totals
    print(f"| all | {n} elements | | {n_exact} ({n_exact / n:.2e}) | {n_fast} ({n_fast / n:.2e}) |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, nargs="?", help="a finished run (its config.yaml and checkpoints)")
    ap.add_argument("--golden-only", action="store_true", help="only the golden vectors' table")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if not args.golden_only:
        if args.run_dir is None:
            ap.error("RUN_DIR is needed (or --golden-only)")
        operand_table(args)
    print()
    print("| order | TE golden RHT cases reproduced (columnwise codes and scales) |")
    print("|---|---|")
    for order, (done, total) in golden_cases_reproduced().items():
        print(f"| {order} | {done} of {total} |")


if __name__ == "__main__":
    main()
