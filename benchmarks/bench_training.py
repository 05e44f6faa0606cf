"""Training throughput of attnres_helpers.model.Transformer against a minimal plain-SDPA reference.

The reference below is the same architecture (pre-LN, tied byte embeddings, GELU MLP, the same
position encoding) written with F.scaled_dot_product_attention only and no score-capture path. It
loads the Transformer's own state_dict, so both compute the same function (checked before timing).
Both are timed side by side in one process on full training steps (forward, backward, clipping,
AdamW), interleaved step by step (alternating which goes first) so that both see the same load on a
shared machine, and the median tokens/s of each is reported. The ratio should be >= 0.9.

    .venv/bin/python benchmarks/bench_training.py [--preset default] [--encoding rope] [--repeats 21]
"""

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attnres_helpers.data import get_batch, load_splits  # noqa: E402
from attnres_helpers.model import PRESETS, Transformer, alibi_slopes, preset, sinusoidal_table  # noqa: E402
from attnres_helpers.train import GRAD_CLIP, batch_generator, make_optimizer  # noqa: E402

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
            q, k = ((torch.cat((t1 * cos - t2 * sin, t1 * sin + t2 * cos), -1)) for t1, t2 in (q.chunk(2, -1), k.chunk(2, -1)))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=bias is None)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class RefBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(cfg.d_model), RefAttention(cfg), nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model))

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


def timed_step(model, optimizer, tokens, batch_size, T, step) -> float:
    """Seconds for one full training step, as attnres_helpers.train takes it."""
    start = time.perf_counter()
    x, y = get_batch(tokens, batch_size, T, batch_generator(0, step))
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--encoding", choices=REFERENCE_ENCODINGS, default="rope")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=21, help="timed training steps of each model")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cfg = preset(args.preset, encoding=args.encoding)
    torch.manual_seed(0)
    model = Transformer(cfg)
    reference = RefTransformer(cfg)
    reference.load_state_dict(model.state_dict())
    train_tokens, _ = load_splits()
    batch_size = args.batch_tokens // cfg.train_len
    x, y = get_batch(train_tokens, batch_size, cfg.train_len, batch_generator(1, 0))
    with torch.no_grad():
        diff = (model(x, y)[0] - reference(x, y)[0]).abs().max().item()
    if diff > 1e-4:
        raise SystemExit(f"the reference does not compute the same function (max |logit diff| = {diff:.2e})")

    runs = {"model": (model, make_optimizer(model, 1e-3, 0.1)),
            "reference": (reference, make_optimizer(reference, 1e-3, 0.1))}
    for step in range(2):  # warm-up: lazy init, allocator
        for net, opt in runs.values():
            timed_step(net, opt, train_tokens, batch_size, cfg.train_len, step)
    tokens_per_s = {name: [] for name in runs}
    for r in range(args.repeats):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]  # alternate who goes first
        for name in order:
            seconds = timed_step(*runs[name], train_tokens, batch_size, cfg.train_len, 2 + r)
            tokens_per_s[name].append(args.batch_tokens / seconds)

    median = {name: statistics.median(v) for name, v in tokens_per_s.items()}
    ratio = median["model"] / median["reference"]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"preset {args.preset} ({cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, "
          f"{n_params / 1e6:.2f}M params), encoding {cfg.encoding}, T = {cfg.train_len}, "
          f"{args.batch_tokens} tokens a step, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"same function: max |logit diff| = {diff:.1e}")
    for name, values in tokens_per_s.items():
        low, _, high = statistics.quantiles(values, n=4)
        print(f"{name:>9}: median {median[name]:,.0f} tokens/s (quartiles {low:,.0f}-{high:,.0f}, {len(values)} steps)")
    print(f"ratio model/reference = {ratio:.3f}  ({'OK' if ratio >= 0.9 else 'BELOW'} the 0.9 target)")


if __name__ == "__main__":
    main()
