"""Lévy cross-attention vs a matched softmax cross-attention: forward and forward+backward time.

Setting of the paper's cost claim (docs/levy.md#cost, "about 1.7× a softmax cross-attention"): n = 512
keys, m = 128 queries, width 128, 4 heads, L = 16 × 8 = 128 cells, float32, batch B = 8. Both
layers share the same Q/K/V/O weights; the softmax layer is the standard multi-head form on
``F.scaled_dot_product_attention`` (PyTorch's fused CPU kernel), the Lévy layer additionally
returns Λ, trΣ_V and σ̂ for every query. Both layers get the same key padding mask (10% of the
keys padded), as a real batch would.

One thread (``torch.set_num_threads(1)``) so that the ratio measures work, not how well each
layer's kernels parallelise, and the time is the CPU time of that thread, which other processes
on a shared machine do not inflate (cache sharing still adds some noise). The layers are timed
alternately in blocks of 5 calls within one run, ``--repeats`` calls each, and the median is
reported; compare the ratio column, not absolute times across machines. Two baselines: the
fused softmax layer (``F.scaled_dot_product_attention``) and the textbook unfused one. Results
go to bench/results/levy_speed.json.

Usage: ``python -m bench.levy_speed [--repeats 30] [--batch 8]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nsacdrive.common.atomic import atomic_write_json
from nsacdrive.controllers.levy import LevyAttentionConfig, LevyCrossAttention

ROOT = Path(__file__).resolve().parents[1]

N_KEYS, N_QUERIES, WIDTH, HEADS, GRID = 512, 128, 128, 4, (16, 8)


class SoftmaxCrossAttention(nn.Module):
    """Standard multi-head softmax cross-attention with the Lévy layer's Q/K/V/O projections.

    ``fused=True`` runs the attention core through ``F.scaled_dot_product_attention`` (PyTorch's
    flash kernel); ``fused=False`` is the textbook form (scores, masked softmax, weighted sum),
    which is what ``nn.MultiheadAttention`` computes when it returns attention weights.
    """

    def __init__(self, levy: LevyCrossAttention, fused: bool) -> None:
        super().__init__()
        self.heads, self.fused = levy.config.num_heads, fused
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = levy.q_proj, levy.k_proj, levy.v_proj, levy.out_proj

    def forward(self, queries: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
        def split(x: Tensor) -> Tensor:
            return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        q, k, v = split(self.q_proj(queries)), split(self.k_proj(tokens)), split(self.v_proj(tokens))
        if self.fused:
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        else:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            attended = scores.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(dim=-1) @ v
        return self.out_proj(attended.transpose(1, 2).flatten(-2))


def timed_ms(fn: Callable[[], object], repeats: int) -> list[float]:
    """CPU time in ms of the calling thread for each of ``repeats`` calls (after one warm-up call).

    With one intra-op thread all work runs on the calling thread, so its CPU time measures the
    layer's work and, unlike wall time, does not grow when other processes share the cores.
    """
    fn()
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        times.append(1e3 * (time.thread_time() - start))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "levy_speed.json")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    levy = LevyCrossAttention(LevyAttentionConfig(embed_dim=WIDTH, num_heads=HEADS, identity_dim=WIDTH, grid=GRID))
    layers = {
        "softmax (fused SDPA)": SoftmaxCrossAttention(levy, fused=True),
        "softmax (unfused)": SoftmaxCrossAttention(levy, fused=False),
    }
    b = args.batch
    queries = torch.randn(b, N_QUERIES, WIDTH, requires_grad=True)
    tokens = torch.randn(b, N_KEYS, WIDTH, requires_grad=True)
    times = torch.rand(b, N_KEYS)
    identity = torch.randn(N_KEYS, WIDTH)
    mask = torch.rand(b, N_KEYS) > 0.1

    forwards: dict[str, Callable[[], Tensor]] = {"Lévy": lambda: levy(queries, tokens, times, identity, mask).output}
    for name, layer in layers.items():
        forwards[name] = lambda layer=layer: layer(queries, tokens, mask)

    def train_step(forward: Callable[[], Tensor]) -> Callable[[], None]:
        def step() -> None:
            forward().square().mean().backward()

        return step

    results: dict[str, dict[str, float]] = {}
    for mode in ("forward", "forward+backward"):
        timings: dict[str, list[float]] = {name: [] for name in forwards}
        with torch.no_grad() if mode == "forward" else torch.enable_grad():
            for _ in range(max(1, args.repeats // 5)):  # alternate in blocks so drifts hit every layer alike
                for name, forward in forwards.items():
                    timings[name] += timed_ms(forward if mode == "forward" else train_step(forward), 5)
        results[mode] = {name: statistics.median(t) for name, t in timings.items()}

    print(
        f"Lévy vs softmax cross-attention: B={b}, n={N_KEYS}, m={N_QUERIES}, width={WIDTH}, heads={HEADS}, L={GRID[0] * GRID[1]}, float32, 1 thread, median of {args.repeats}"
    )
    print(f"{'pass':<18}{'baseline':<22}{'baseline ms':>12}{'Lévy ms':>10}{'ratio':>8}")
    rows = []
    for mode, times_ms in results.items():
        for name in layers:
            ratio = times_ms["Lévy"] / times_ms[name]
            rows.append(
                {"pass": mode, "baseline": name, "baseline_ms": times_ms[name], "levy_ms": times_ms["Lévy"], "ratio": ratio}
            )
            print(f"{mode:<18}{name:<22}{times_ms[name]:>12.2f}{times_ms['Lévy']:>10.2f}{ratio:>7.2f}×")
    print("target ratio ≤ 1.5× (paper: about 1.7×)")
    setting = {"batch": b, "keys": N_KEYS, "queries": N_QUERIES, "width": WIDTH, "heads": HEADS, "cells": GRID[0] * GRID[1]}
    atomic_write_json(args.out, {"setting": setting, "threads": 1, "repeats": args.repeats, "dtype": "float32", "results": rows})


if __name__ == "__main__":
    main()
