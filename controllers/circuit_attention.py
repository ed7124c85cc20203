"""Shared machinery of NAC and NSAC: projections, key selection, pair features, time gates.

Both layers attend from each query i to K selected keys j through a per-pair feature
p_ij = [q_i ; k_j] (docs/nsac.md#key-selection): the dot product q·k is used ONLY to choose the keys, never
in the logits; the logits come from a small circuit applied to p_ij and a time gate
τ_ij = σ(±a_ij·t_i + b_ij) (docs/nsac.md#time-gate).

Two key-selection rules:

* ``corrected`` (default): exact top-K over all keys, padded keys excluded, every key selectable;
  with K ≥ T all keys are kept in their original order.
* ``reference``: the published "square-root partitioning" (s = ⌊√T⌋ blocks of s keys, the
  best ⌊K/s⌋+1 blocks by centroid score, then top-K inside them). Keys with index ≥ s·⌊T/s⌋
  can never be selected (the published tail drop), kept for parity studies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from nsacdrive.common.config_checks import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL, Range, check_fields

Mode = Literal["corrected", "reference"]


@dataclass(frozen=True)
class CircuitAttentionConfig:
    """Settings shared by NAC and NSAC (docs/nsac.md#layer-overview)."""

    input_dim: int
    d_model: int = 64
    num_heads: int = 16
    topk: int = 8
    mode: Mode = "corrected"
    sparsity: float = 0.5
    wiring_seed: int = 22222
    tau_epsilon: float = 1e-6
    dropout: float = 0.0
    return_sequences: bool = False

    def __post_init__(self) -> None:
        # types of every field, the subclasses' too; ranges of the shared ones
        ranges = {**dict.fromkeys(("input_dim", "d_model", "num_heads", "topk"), AT_LEAST_ONE), "sparsity": UNIT_INTERVAL,
                  "wiring_seed": NON_NEGATIVE, "tau_epsilon": POSITIVE, "dropout": Range(0, 1, high_open=True)}
        check_fields(self, "attention config", ranges)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def backbone_units(self) -> int:
        """U_b = d + ⌊d / 0.6⌋ neurons, as the published backbone (docs/nsac.md#ncp-circuit)."""
        return self.d_model + int(self.d_model / 0.6)


@dataclass
class SelectedPairs:
    """Queries, selected keys/values and the pair features, all [B, H, Tq, K(, ·)]."""

    index: torch.Tensor  # [B, H, Tq, K] key indices
    pairs: torch.Tensor  # [B, H, Tq, K, 2D]
    values: torch.Tensor  # [B, H, Tq, K, D]
    valid: torch.Tensor  # [B, 1, 1, K] or [B, H, Tq, K] bool: selected key is not padding


def glorot_linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    """nn.Linear with TF's default init (Glorot-uniform kernel, zero bias), as the published layers."""
    layer = nn.Linear(n_in, n_out, bias=bias)
    nn.init.xavier_uniform_(layer.weight)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def exact_topk(q: torch.Tensor, k: torch.Tensor, topk: int, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Indices [B, H, Tq, K_eff] of the top-K keys by q·k; every (unpadded) key is selectable."""
    batch, heads, n_queries, _ = q.shape
    n_keys = k.shape[2]
    if topk >= n_keys:
        return torch.arange(n_keys, device=q.device).expand(batch, heads, n_queries, n_keys)
    with torch.no_grad():
        scores = q @ k.transpose(-1, -2)
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
        return scores.topk(topk, dim=-1).indices


def block_topk(q: torch.Tensor, k: torch.Tensor, topk: int) -> torch.Tensor:
    """The published square-root partitioned top-K (docs/nsac.md#key-selection), tail drop included."""
    n_keys = k.shape[2]
    size = max(int(math.isqrt(n_keys)), 1)
    n_blocks = n_keys // size
    with torch.no_grad():
        blocks = k[:, :, : n_blocks * size].reshape(*k.shape[:2], n_blocks, size, k.shape[-1])
        coarse = q @ blocks.mean(dim=3).transpose(-1, -2)  # [B, H, Tq, M]
        kept_blocks = coarse.topk(min(n_blocks, topk // size + 1), dim=-1).indices  # [B, H, Tq, m_b]
        candidates = (kept_blocks[..., None] * size + torch.arange(size, device=q.device)).flatten(-2)
        cand_keys = torch.gather(k[:, :, None].expand(-1, -1, q.shape[2], -1, -1), 3,
                                 candidates[..., None].expand(-1, -1, -1, -1, k.shape[-1]))
        refined = (cand_keys * q[:, :, :, None, :]).sum(-1)
        best = refined.topk(min(topk, candidates.shape[-1]), dim=-1).indices
        return torch.gather(candidates, -1, best)


class CircuitAttentionCore(nn.Module):
    """q/k/v projections, key selection, pair features and the two time-gate maps."""

    def __init__(self, config: CircuitAttentionConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        # The published q/k/v "NCP sensory cells" reduce exactly to per-time-step affine maps (docs/nsac.md#projections).
        self.query = glorot_linear(config.input_dim, d)
        self.key = glorot_linear(config.input_dim, d)
        self.value = glorot_linear(config.input_dim, d)
        self.gate_a = glorot_linear(2 * config.head_dim, 1)
        self.gate_b = glorot_linear(2 * config.head_dim, 1)
        self.attention_dropout = nn.Dropout(config.dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, d] → [B, H, T, D] (head h owns features h·D … h·D+D−1)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.config.num_heads, self.config.head_dim).transpose(1, 2)

    @staticmethod
    def combine_heads(x: torch.Tensor) -> torch.Tensor:
        """[..., H, T, D] → [..., T, H·D]."""
        return x.transpose(-3, -2).flatten(-2)

    def select(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> SelectedPairs:
        """Project x [B, T, F] and build the pairs of the queries (all T, or the last one)."""
        cfg = self.config
        queries_in = x if cfg.return_sequences else x[:, -1:]
        q = self.split_heads(self.query(queries_in))
        k = self.split_heads(self.key(x))
        v = self.split_heads(self.value(x))
        if cfg.mode == "corrected":
            index = exact_topk(q, k, cfg.topk, key_mask)
        else:
            index = block_topk(q, k, cfg.topk)
        n_keys = index.shape[-1]
        gather_index = index[..., None].expand(-1, -1, -1, -1, cfg.head_dim)
        k_sel = torch.gather(k[:, :, None].expand(-1, -1, q.shape[2], -1, -1), 3, gather_index)
        v_sel = torch.gather(v[:, :, None].expand(-1, -1, q.shape[2], -1, -1), 3, gather_index)
        pairs = torch.cat([q[:, :, :, None, :].expand(-1, -1, -1, n_keys, -1), k_sel], dim=-1)
        if key_mask is None:
            valid = torch.ones(1, 1, 1, n_keys, dtype=torch.bool, device=x.device)
        else:
            valid = torch.gather(key_mask[:, None, None, :].expand(-1, cfg.num_heads, q.shape[2], -1), 3, index)
        return SelectedPairs(index, pairs, v_sel, valid)

    def time_gate(self, pairs: torch.Tensor, t: torch.Tensor | None, sign: float) -> torch.Tensor:
        """τ_ij = σ(sign·a_ij·t_i + b_ij) ∈ (0, 1); t [B, Tq] per query, None or reference mode → t ≡ 1."""
        a = self.gate_a(pairs).squeeze(-1)
        b = self.gate_b(pairs).squeeze(-1)
        if t is None or self.config.mode == "reference":
            return torch.sigmoid(sign * a + b)
        query_times = t if self.config.return_sequences else t[:, -1:]
        return torch.sigmoid(sign * a * query_times[:, None, :, None] + b)


def validate_inputs(x: torch.Tensor, t: torch.Tensor | None, key_mask: torch.Tensor | None, input_dim: int) -> None:
    """Clear errors for the shapes a caller most often gets wrong."""
    if x.dim() != 3 or x.shape[-1] != input_dim:
        raise ValueError(f"x must have shape [B, T, {input_dim}], got {tuple(x.shape)}")
    if t is not None and t.shape != x.shape[:2]:
        raise ValueError(f"t must have shape [B, T] = {tuple(x.shape[:2])} (per-token times), got {tuple(t.shape)}")
    if key_mask is not None:
        if key_mask.shape != x.shape[:2] or key_mask.dtype != torch.bool:
            raise ValueError(f"key_mask must be a bool tensor of shape {tuple(x.shape[:2])}, got {key_mask.dtype} {tuple(key_mask.shape)}")
        if not bool(key_mask.any(dim=1).all()):
            raise ValueError("key_mask: every sample needs at least one valid key")
