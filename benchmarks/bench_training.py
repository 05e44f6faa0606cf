"""Training throughput of attnres_helpers.model.Transformer: today's trainer against faster variants
and against a minimal plain-SDPA reference, side by side in one run.

Variants, each its own copy of the same initial weights with its own AdamW, all fed the same batches:

  (i)   fp32 eager, 1 thread: today's trainer (``experiments.train_specs``: a model per worker process, 1 thread);
  (ii)  bf16 autocast: the forward pass and loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``
        (weights, gradients and AdamW stay fp32), 1 thread;
  (iii) torch.compile of the model (inductor), 1 thread; its compile time, taken by the first step,
        is reported separately and left out of tokens/s;
  (iv)  fp32 eager with --threads threads (default 2) against (i)'s 1 thread;
  (v)   --models small models (default 4) trained as one batched computation in one thread: their
        parameters stacked (``torch.func.stack_module_state``), one ``vmap`` of ``grad_and_value`` over
        ``functional_call``, per-model gradient clipping, one AdamW over the stacked tensors (AdamW is
        elementwise, so this is each model's own AdamW); tokens/s counts every model's tokens, so its
        ratio to (i) is the throughput gain for many small models on one core. Model 0 starts from (i)'s
        weights; its step-0 loss is compared with (i)'s;
  and   the reference: the same architecture (pre-LN, tied byte embeddings, GELU MLP, the same position
        encoding) written with F.scaled_dot_product_attention only and no score-capture path, fp32 eager,
        1 thread. It loads the Transformer's own state_dict, so both compute the same function (checked
        before timing). The ratio (i)/reference should be >= 0.9.

A timed step is a full training step as attnres_helpers.train takes it (batch, forward, backward,
clipping, AdamW). After --warmup untimed steps, the variants take --steps timed steps interleaved step
by step (the order rotating every round), so that all see the same load on a shared machine; the median
tokens/s of each is reported, and its ratio to (i). The step-0 loss of every variant is printed next to
(i)'s: same weights, same batch, so it shows what bf16 and compilation change in the numbers.

    .venv/bin/python benchmarks/bench_training.py [--preset default] [--encoding rope] [--steps 10]
    .venv/bin/python benchmarks/bench_training.py --quick    # 2 timed steps after 1 warm-up: a smoke run
    .venv/bin/python benchmarks/bench_training.py --variants fp32 bf16   # a subset

Not a timed test: the numbers depend on the machine and on what else runs on it.
"""

import argparse
import math
import os
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnres_helpers.data import get_batch, load_splits
from attnres_helpers.model import PRESETS, Transformer, alibi_slopes, preset, sinusoidal_table
from attnres_helpers.train import GRAD_CLIP, batch_generator, make_optimizer

REFERENCE_ENCODINGS = ("rope", "nope", "alibi", "sinusoidal")


class RefAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x, rope, bias):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.cfg.n_head, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        if rope is not None:
            cos, sin = rope  # (T, d/2)
            q, k = (
                (torch.cat((t1 * cos - t2 * sin, t1 * sin + t2 * cos), -1))
                for t1, t2 in (q.chunk(2, -1), k.chunk(2, -1))
            )
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=bias is None)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class RefBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(cfg.d_model), RefAttention(cfg), nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x, rope, bias):
        x = x + self.attn(self.ln_1(x), rope, bias)
        return x + self.mlp(self.ln_2(x))


class RefTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.encoding not in REFERENCE_ENCODINGS:
            raise ValueError(f"the reference implements {REFERENCE_ENCODINGS}, not {cfg.encoding!r}")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(RefBlock(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)

    def forward(self, idx, targets):
        T, cfg = idx.shape[1], self.cfg
        x = self.wte(idx)
        rope = bias = None
        if cfg.encoding == "sinusoidal":
            x = x * math.sqrt(cfg.d_model) + sinusoidal_table(T, cfg.d_model)
        if cfg.encoding == "rope":
            theta = cfg.rope_base ** (-torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
            angle = torch.arange(T).float()[:, None] * theta
            rope = angle.cos(), angle.sin()
        if cfg.encoding == "alibi":
            dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float()
            slopes = alibi_slopes(cfg.n_head) * cfg.alibi_slope_scale
            bias = (-slopes[:, None, None] * dist).masked_fill(dist < 0, float("-inf"))  # (H, T, T)
        for block in self.blocks:
            x = block(x, rope, bias)
        logits = self.ln_f(x) @ self.wte.weight.T
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def training_step(model, optimizer, tokens, batch_size, T, step, autocast=None) -> float:
    """One full training step, as attnres_helpers.train takes it; returns the loss."""
    x, y = get_batch(tokens, batch_size, T, batch_generator(0, step))
    with autocast() if autocast else nullcontext():
        _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    return loss.item()


@dataclass
class Variant:
    key: str
    label: str
    model: nn.Module  # what is called: the Transformer, its torch.compile wrapper, or the reference
    params: nn.Module  # whose parameters the optimizer and clipping see
    threads: int
    autocast: object = None  # a callable returning a context manager, or None
    optimizer: object = None
    tokens_per_s: list = field(default_factory=list)
    first_step_s: float | None = None  # wall time of the first (warm-up) step: includes compilation
    step0_loss: float | None = None
    error: str | None = None

    def step(self, tokens, batch_size, T, step) -> float:
        """Seconds for one training step on this variant's thread count."""
        torch.set_num_threads(self.threads)
        start = time.perf_counter()
        loss = training_step(self.model, self.optimizer, tokens, batch_size, T, step, self.autocast)
        seconds = time.perf_counter() - start
        if step == 0:
            self.step0_loss, self.first_step_s = loss, seconds
        return seconds


class BatchedVariant:
    """Variant (v): ``n_models`` copies of the architecture (model 0 with ``base``'s weights, the others
    with seeds 1..n−1) trained as one vmapped computation; each model draws its own batch."""

    def __init__(self, cfg, base: Transformer, n_models: int, threads: int = 1):
        import copy

        from torch.func import stack_module_state

        models = [base]
        for m in range(1, n_models):
            torch.manual_seed(m)
            models.append(Transformer(cfg))
        self.key, self.threads, self.n_models = "batched", threads, n_models
        self.label = f"(v)   {n_models} models, one vmapped step"
        self.params, self.buffers = stack_module_state([copy.deepcopy(m).train() for m in models])
        self.skeleton = copy.deepcopy(base).to("meta")
        decay = [p for p in self.params.values() if p.ndim >= 3]  # a matrix, stacked
        rest = [p for p in self.params.values() if p.ndim < 3]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
            lr=1e-3,
            betas=(0.9, 0.98),
            foreach=False,
        )
        self.tokens_per_s, self.first_step_s, self.step0_loss, self.error = [], None, None, None

    def _loss(self, params, buffers, x, y):
        from torch.func import functional_call

        return functional_call(self.skeleton, (params, buffers), (x, y))[1]

    def step(self, tokens, batch_size, T, step) -> float:
        from torch.func import grad_and_value, vmap

        torch.set_num_threads(self.threads)
        start = time.perf_counter()
        xs, ys = zip(*(get_batch(tokens, batch_size, T, batch_generator(m, step)) for m in range(self.n_models)))
        grads, losses = vmap(grad_and_value(self._loss))(self.params, self.buffers, torch.stack(xs), torch.stack(ys))
        norms = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))  # (models,)
        scale = (GRAD_CLIP / (norms + 1e-6)).clamp(max=1.0)
        for name, p in self.params.items():
            p.grad = grads[name] * scale.view(-1, *([1] * (p.ndim - 1)))
        self.optimizer.step()
        seconds = time.perf_counter() - start
        if step == 0:
            self.step0_loss, self.first_step_s = losses[0].item(), seconds
        return seconds


VARIANTS = ("fp32", "bf16", "compile", "threads", "batched", "reference")


def build_variants(cfg, base: Transformer, keys, threads: int, n_models: int = 4) -> list:
    """Every requested variant, each a fresh copy of ``base``'s initial weights with its own AdamW."""

    def copy():
        model = Transformer(cfg)
        model.load_state_dict(base.state_dict())
        return model.train()

    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    variants = []
    for key in keys:
        if key == "fp32":
            m = copy()
            variants.append(Variant(key, "(i)   fp32 eager (today's trainer)", m, m, 1))
        elif key == "bf16":
            m = copy()
            variants.append(Variant(key, "(ii)  bf16 autocast", m, m, 1, bf16))
        elif key == "compile":
            m = copy()
            variants.append(Variant(key, "(iii) torch.compile (inductor)", torch.compile(m), m, 1))
        elif key == "threads":
            m = copy()
            variants.append(Variant(key, f"(iv)  fp32 eager, {threads} threads", m, m, threads))
        elif key == "reference":
            m = RefTransformer(cfg)
            m.load_state_dict(base.state_dict())
            variants.append(Variant(key, "      plain-SDPA reference, fp32", m.train(), m, 1))
    for v in variants:
        v.optimizer = make_optimizer(v.params, 1e-3, 0.1)
    if "batched" in keys:
        variants.append(BatchedVariant(cfg, copy_of(cfg, base), n_models))
    return variants


def copy_of(cfg, base: Transformer) -> Transformer:
    model = Transformer(cfg)
    model.load_state_dict(base.state_dict())
    return model


def quartiles(values: list[float]) -> str:
    if len(values) < 2:
        return "-"
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:,.0f}-{high:,.0f}"


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--encoding", choices=REFERENCE_ENCODINGS, default="rope")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument(
        "--steps",
        "--repeats",
        type=int,
        default=None,
        help="timed training steps of each variant (default 10; 2 with --quick)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed steps before them (default 2; 1 with --quick); the first includes compilation",
    )
    parser.add_argument("--threads", type=int, default=2, help="threads of variant (iv) (default 2)")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="which to run (default: all); fp32, variant (i), is always run, as the base of the ratios",
    )
    parser.add_argument("--models", type=int, default=4, help="models in the batched variant (v) (default 4)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 timed steps after 1 warm-up step")
    args = parser.parse_args()
    steps = args.steps if args.steps is not None else (2 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if steps < 1 or warmup < 1 or args.threads < 1:
        parser.error("--steps, --warmup and --threads must be >= 1 (the first warm-up step takes the compilation)")
    keys = ["fp32"] + [k for k in VARIANTS if k in args.variants and k != "fp32"]

    torch.set_num_threads(1)
    cfg = preset(args.preset, encoding=args.encoding)
    if args.batch_tokens < cfg.train_len or args.batch_tokens % cfg.train_len:
        parser.error(f"--batch-tokens must be a positive multiple of train_len ({cfg.train_len})")
    torch.manual_seed(0)
    base = Transformer(cfg)
    train_tokens, _ = load_splits()
    batch_size = args.batch_tokens // cfg.train_len

    diff = None
    if "reference" in keys:
        reference = RefTransformer(cfg)
        reference.load_state_dict(base.state_dict())
        x, y = get_batch(train_tokens, batch_size, cfg.train_len, batch_generator(1, 0))
        with torch.no_grad():
            diff = (base(x, y)[0] - reference(x, y)[0]).abs().max().item()
        if diff > 1e-4:
            raise SystemExit(f"the reference does not compute the same function (max |logit diff| = {diff:.2e})")

    variants = build_variants(cfg, base, keys, args.threads, args.models)
    live = list(variants)
    for step in range(warmup):  # lazy init, allocator; the compiled variant compiles in its first step
        for v in list(live):
            try:
                v.step(train_tokens, batch_size, cfg.train_len, step)
            except Exception as err:  # noqa: BLE001 - a benchmark reports a variant it cannot run
                v.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
                live.remove(v)
    for r in range(steps):
        order = live[r % len(live) :] + live[: r % len(live)]  # rotate who goes first
        for v in order:
            seconds = v.step(train_tokens, batch_size, cfg.train_len, warmup + r)
            v.tokens_per_s.append(args.batch_tokens * getattr(v, "n_models", 1) / seconds)
    torch.set_num_threads(1)

    median = {v.key: statistics.median(v.tokens_per_s) for v in live}
    base_v = variants[0]
    n_params = sum(p.numel() for p in base.parameters())
    print(
        f"preset {args.preset} ({cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, "
        f"{n_params / 1e6:.2f}M params), encoding {cfg.encoding}, T = L = {cfg.train_len}, "
        f"{args.batch_tokens} tokens a step ({batch_size} windows), torch {torch.__version__}"
    )
    print(
        f"{warmup} warm-up + {steps} timed steps of each variant, interleaved; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    if diff is not None:
        print(f"reference computes the same function: max |logit diff| = {diff:.1e}")
    print()
    header = (
        f"{'variant':40s} {'threads':>7s} {'tokens/s':>9s} {'quartiles':>15s} {'ratio to (i)':>12s} "
        f"{'step-0 loss':>11s} {'- (i)':>9s}"
    )
    print(header)
    print("-" * len(header))
    for v in variants:
        if v.error:
            print(f"{v.label:40s} {v.threads:7d}  failed: {v.error}")
            continue
        ratio = median[v.key] / median["fp32"]
        dloss = v.step0_loss - base_v.step0_loss
        print(
            f"{v.label:40s} {v.threads:7d} {median[v.key]:9,.0f} {quartiles(v.tokens_per_s):>15s} "
            f"{ratio:12.2f} {v.step0_loss:11.5f} {dloss:+9.1e}"
        )
    print()
    compiled = next((v for v in variants if v.key == "compile" and not v.error), None)
    if compiled:
        compiled_s, eager_s = args.batch_tokens / median["compile"], args.batch_tokens / median["fp32"]
        overhead = compiled.first_step_s - compiled_s
        if compiled_s < eager_s:
            payback = f"it pays for itself after about {math.ceil(overhead / (eager_s - compiled_s))} steps"
        else:
            payback = "the compiled step is not faster than (i)"
        print(
            f"torch.compile: compile time {overhead:.1f} s (its first step took {compiled.first_step_s:.1f} s: "
            f"compiling the forward and backward graphs; inductor's cache in /tmp makes a second run faster), "
            f"not in tokens/s; {payback}"
        )
    if "reference" in median:
        ratio = median["fp32"] / median["reference"]
        print(f"ratio (i)/reference = {ratio:.3f}  ({'OK' if ratio >= 0.9 else 'BELOW'} the 0.9 target)")


if __name__ == "__main__":
    main()
