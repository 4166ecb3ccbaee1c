"""The PyTorch engine's step: gradient accumulation equals one big batch; a non-finite loss skips the
update on the device (weights and optimizer state untouched, no leftover gradients) and the guard,
fed the step's values afterwards, counts it and halts after K in a row."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nvfp4train.optim import OptimConfig
from nvfp4train.parallel import DistInfo
from nvfp4train.train.engines import TorchEngine
from nvfp4train.train.guards import NonFiniteGuard, TrainingHalted
from nvfp4train.train.plan import decide_compile
from tests.conftest import run_train

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
CUDA = torch.cuda.is_available()


class TinyLM(nn.Module):
    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("poison", torch.ones(()))  # set to NaN to make the loss non-finite

    def forward(self, tokens, targets):
        logits = self.head(self.emb(tokens)) * self.poison
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def engine_of(model, compile: bool = False) -> TorchEngine:
    return TorchEngine(
        model,
        lambda m: [{"params": list(m.parameters())}],
        OptimConfig(lr=1e-2, grad_clip=0.0),
        "ddp",
        CPU,
        compile=compile,
    )


def make_engine():
    torch.manual_seed(0)
    model = TinyLM()
    return model, engine_of(model)


def batches(n, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, 32, (n * rows, 9), generator=g)
    return [(toks[i * rows : (i + 1) * rows, :-1], toks[i * rows : (i + 1) * rows, 1:]) for i in range(n)]


def test_accumulation_matches_one_big_batch():
    (m1, e1), (m2, e2) = make_engine(), make_engine()
    big = batches(1, 8)
    small = [(big[0][0][i : i + 2], big[0][1][i : i + 2]) for i in range(0, 8, 2)]
    s1, s2 = e1.train_step(big, lr=1e-2, step=1), e2.train_step(small, lr=1e-2, step=1)
    assert s1.loss.item() == pytest.approx(s2.loss.item(), rel=1e-5)
    assert s1.grad_norm.item() == pytest.approx(s2.grad_norm.item(), rel=1e-4)
    for p, q in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)  # Adam divides by tiny sqrt(v)


def test_nonfinite_step_is_skipped_on_the_device_then_the_guard_halts():
    model, engine = make_engine()
    guard = NonFiniteGuard(max_in_row=2)
    stats = engine.train_step(batches(1, 4), lr=1e-2, step=1)
    assert bool(stats.applied) and guard.check(1, stats.loss.item(), stats.grad_norm.item())
    before = [p.detach().clone() for p in model.parameters()]
    moments = [v.clone() for st in engine.optimizer.state.values() for v in st.values()]
    model.poison.fill_(math.nan)
    stats = engine.train_step(batches(1, 4, seed=1), lr=1e-2, step=2)
    assert not bool(stats.applied) and math.isnan(stats.loss.item())
    for p, q in zip(before, model.parameters()):
        assert torch.equal(p, q)  # no update from the bad step
    for m, v in zip(moments, (v for st in engine.optimizer.state.values() for v in st.values())):
        assert torch.equal(m, v)  # moments and step count untouched
    assert all(p.grad is None for p in model.parameters())  # nor leftover gradients
    assert not guard.check(2, stats.loss.item(), stats.grad_norm.item()) and guard.total_skipped == 1
    stats = engine.train_step(batches(1, 4, seed=2), lr=1e-2, step=3)
    with pytest.raises(TrainingHalted, match="2 steps in a row"):
        guard.check(3, stats.loss.item(), stats.grad_norm.item())
    model.poison.fill_(1.0)
    assert bool(engine.train_step(batches(1, 4, seed=3), lr=1e-2, step=4).applied)


def test_compile_auto_means_cuda_only():
    assert not decide_compile("auto", "cpu", mamba_blocks=0)[0] and decide_compile("auto", "cuda", mamba_blocks=2)[0]
    assert decide_compile("true", "cpu", mamba_blocks=0)[0] and not decide_compile("false", "cuda", mamba_blocks=2)[0]


def test_quantized_weights_follow_every_optimizer_step_without_the_controller():
    """The engine's optimizer bumps the layers' weight epoch after every step (its post-step hook), so the
    quantized-weight caches follow the update of torch's fused AdamW (which keeps no version counter) with no
    controller call. A caller that never calls
    PrecisionController.on_step (the benchmark, a library user) trains exactly as the trainer does."""
    from nvfp4train.config import load_preset
    from nvfp4train.model import HybridLM, ModelConfig, param_groups
    from nvfp4train.precision import PrecisionController, PrecisionPolicy, build_linear_factory

    cfg = ModelConfig.from_dict(load_preset("model", "hybrid_tiny"))
    tokens = torch.randint(0, cfg.vocab_size, (4, 2, 33), generator=torch.Generator().manual_seed(0))
    losses = []
    for with_controller_steps in (True, False):
        torch.manual_seed(0)
        policy = PrecisionPolicy.from_dict({**load_preset("precision", "nvfp4"), "stats_every": 0})
        model = HybridLM(cfg, layer_factory=build_linear_factory(policy, n_blocks=len(cfg.pattern), seed=3))
        ctl = PrecisionController(policy, model)
        engine = TorchEngine(model, lambda m: param_groups(m, 0.1), OptimConfig(lr=1e-2), "ddp", CPU)
        run = []
        for step, t in enumerate(tokens, start=1):
            if with_controller_steps:
                ctl.on_step(step / len(tokens))
            run.append(engine.train_step([(t[:, :-1], t[:, 1:])], lr=1e-2, step=step).loss.item())
        losses.append(run)
    assert losses[0] == losses[1]
    assert len(set(losses[0])) == len(tokens)  # the steps trained: a stale weight would change the later losses


def test_evaluation_does_not_compile_the_model_again():
    """train.compile=true: held-out evaluation (no grad, eval mode) runs the model uncompiled. Through the
    compiled training forward it compiled the whole model a second time (grad mode is a guard)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = TinyLM()
    engine = engine_of(model, compile=True)
    ((x, y),) = batches(1, 4)
    engine.train_step([(x, y)], lr=1e-2, step=1)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1  # the training step ran compiled
    model.eval()
    with torch.no_grad():
        loss = engine.module(x, y)
    assert counters["stats"]["unique_graphs"] == graphs
    torch.testing.assert_close(loss, F.cross_entropy(model.head(model.emb(x)).float().flatten(0, 1), y.flatten()))
    torch._dynamo.reset()


def test_every_compiled_run_of_a_process_runs_compiled():
    """A process that trains run after run (a Hydra -m sweep, a benchmark): dynamo compiles again for every new
    model, and past its recompile limit (8) it ran the later runs eagerly. Each engine starts from fresh
    compile caches, so the tenth run's step is compiled like the first's."""
    from torch._dynamo.utils import counters

    class SeededLM(TinyLM):  # a constant of its own that the forward reads, as a run's seed in its quantizers
        def __init__(self, seed: int):
            super().__init__()
            self.seed = seed

        def forward(self, tokens, targets):
            return super().forward(tokens, targets) * (1.0 + self.seed * 1e-6)

    ((x, y),) = batches(1, 4)
    for run in range(10):
        torch.manual_seed(run)
        model = SeededLM(run)
        engine = engine_of(model, compile=True)
        before = counters["stats"]["unique_graphs"]
        engine.train_step([(x, y)], lr=1e-2, step=1)
        assert counters["stats"]["unique_graphs"] > before, f"run {run} ran eagerly"
    torch._dynamo.reset()


def test_compile_true_on_cpu_is_refused_for_mamba_blocks(tmp_path):
    """Inductor's CPU code for the PyTorch SSD scan returns NaN where eager does not (hybrid_tiny, seq 128:
    loss nan from step 1): the trainer refuses the setting with one line instead of training on NaN."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    proc = run_train(
        "model=hybrid_tiny", "train.compile=true", "train.max_steps=1", f"out_dir={tmp_path / 'run'}", check=False
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.compile=true" in lines[0] and "allowed here: auto" in lines[0], proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no GPU")])]
)
@pytest.mark.parametrize("grad_clip", [0.0, 0.05, 1e6])
def test_clipping_is_clip_grad_norm_then_adamw(grad_clip, device):
    """The engine's step clips as torch's clip_grad_norm_ (0: no clipping; 1e6: a norm under max_norm; 0.05:
    clipped), then steps fused AdamW: the same weights, bit for bit, and the norm before clipping reported.
    On CUDA the engine applies the coefficient inside its optimizer's kernel (optim/adamw_kernel.py); on CPU it
    multiplies the gradients first. (Clipped, Adam's step differs from the unclipped one through eps: about 2e-4
    here.)"""
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device(device))
    torch.manual_seed(0)
    model = TinyLM().to(device)
    engine = TorchEngine(
        model, lambda m: [{"params": list(m.parameters())}], OptimConfig(lr=1e-2, grad_clip=grad_clip), "ddp", info
    )
    assert engine.fused_clipping == (device == "cuda")
    torch.manual_seed(0)
    ref = TinyLM().to(device)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    data = batches(1, 4)  # the engine moves them to its device
    stats = engine.train_step(data, lr=1e-2, step=1)
    with engine.autocast():  # the engine's forward, as it runs it
        loss = ref(*(t.to(device) for t in data[0]))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), grad_clip if grad_clip > 0 else math.inf)
    opt.step()
    assert stats.grad_norm.item() == norm.item() and norm.item() > 0.05  # reported before clipping
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))


def test_inductors_tf32_hint_is_filtered_and_fp32_matmuls_keep_their_precision():
    """Inductor hints at TF32 when it compiles an FP32 GEMM on an sm_80+ GPU; TF32 would change the SSD scan's bits,
    so the engine filters the hint and leaves the precision as torch's default. The filter must match torch's
    own wording (read from its source), and swallow that hint only."""
    import inspect
    import warnings

    from torch._inductor import compile_fx

    from nvfp4train.train.engines.torch import TF32_HINT, keep_fp32_matmuls

    assert TF32_HINT in inspect.getsource(compile_fx._warn_tf32_disabled)
    before = (torch.backends.cuda.matmul.fp32_precision, torch.get_float32_matmul_precision())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert keep_fp32_matmuls(torch.device("cpu")) is None  # no GPU: no hint, nothing for train.log
        line = keep_fp32_matmuls(torch.device("cuda"))  # reads a flag only: no GPU needed
        hint = TF32_HINT + ". Consider setting `torch.set_float32_matmul_precision('high')`"
        warnings.warn(hint, UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]
    assert (torch.backends.cuda.matmul.fp32_precision, torch.get_float32_matmul_precision()) == before
    assert before[1] == "highest" and "FP32 matmuls stay FP32" in line and "filtered" in line
