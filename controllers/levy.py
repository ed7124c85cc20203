"""Lévy attention: cross-attention whose keys emit a Poisson field of values (docs/levy.md).

Each key i sits at a point s_i = (t_i, u_i) of the index space S = [0, 1]², where t is its time
and u = sigmoid(chan(e_i)) a learned, per-head channel coordinate of its identity vector e_i.
A query q lays an intensity over S: every key contributes τ·κ(q, k_i) = τ·exp(β·cos(q, k_i))
times a Gaussian mollifier (standard deviations ε) centred on s_i and renormalised to mass 1 on
S. The grid of L = L_t × L_v cells turns that into cell intensities λ_l(q) = τ Σ_i κ_i M_il,
where M_il is the exact mass of key i's mollifier inside cell l. A partition of unity over the
keys turns the values into a value field V_l. The layer returns, per query and head (docs/levy.md#evidence onwards):

* the mean path ā = Σ_l p_l V_l with p = λ/Λ (used in training; exactly differentiable),
* the evidence Λ = Σ_l λ_l = τ Σ_i κ_i (independent of the grid),
* the disagreement trΣ_V = Σ_l p_l ‖V_l − ā‖²,
* the deviation σ̂ = sqrt(trΣ_V · φ(Λ)), φ(Λ) = E[1{Z≥1}/Z], Z ~ Poisson(Λ).

σ̂ is the exact RMS deviation of the sampled layer (N_l ~ Poisson(λ_l), a = Σ N_l V_l / Σ N_l,
a = ā when no count falls) around ā (docs/levy.md#sampled-layer); :meth:`LevyCrossAttention.sample`
draws from it. Choices where the spec left room are noted where they are made; the main ones:

* The deterministic path uses the per-key form ā = Σ_i π_i ṽ_i with π = κ/Σκ and ṽ = M V
  (docs/levy.md#mean-path, exactly equal to the cell form). It avoids the
  m × L intensity tensor; only the sampler builds λ. Both softmax-shaped steps run on PyTorch's
  fused attention kernel (``F.scaled_dot_product_attention``): the value field (cells attend to
  keys with logits that are bilinear in cell and key features) and the query side (κ is a
  softmax numerator; a zero "reference" key of known weight 1 recovers Σκ, so Λ comes out of
  the same call). Cost per head: O(mnd + nLd) plus the n × L mass matrix, against O(mnd) for
  softmax attention.
* trΣ_V is computed centred: with a per-head centre c (the mean of the value field over the
  cells), D_l = V_l − c, w_i = Σ_l M_il ‖D_l‖², trΣ_V = Σ_i π_i w_i − ‖ā − c‖², clamped ≥ 0.
  The shortcut Σ_l p_l‖V_l‖² − ‖ā‖² cancels catastrophically when the values share a large
  offset (10% error at offset 100 in float32, docs/levy.md#centred-disagreement); centring removes the offset before
  squaring. The remaining rounding error is ≈ 1e-7 · (Σ_l p_l ‖D_l‖²) / trΣ_V relative in float32,
  i.e. harmless unless a query's p concentrates on cells whose values barely differ while other
  cells differ a lot (very sharp kernels, β ≫ 1; use float64 there).
* Empty history: samples without a valid key get one learned neutral token (time 1, learned
  identity vector), so every softmax stays defined. Its Λ is about τ·κ, small, and σ̂ is not
  meaningful there; :attr:`LevyOutput.empty_history` flags those samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from nsacdrive.controllers.noise import poisson_on

#: the largest kernel sharpness β: κ = exp(β·cos) must stay finite in float32 and Σκ resolvable
#: against the reference key's weight 1 (docs/levy.md#kernel: β ∈ {1, 4, 10} is the ablation range)
MAX_SHARPNESS = 50.0
_PHI_SWITCH = 40.0  # φ: Poisson-sum branch below, asymptotic series above (docs/levy.md#the-function-phi)
_PHI_TERMS = 160  # Poisson terms z = 1..160: the tail of Poisson(40) beyond 160 is < 1e-40
_PHI_ORDER = 12  # asymptotic series Σ_{k≤12} k!/Λ^{k+1}; truncation error < 1e-11 relative at Λ = 40
_TINY = 1e-300
_NORM_EPS = 1e-12  # F.normalize's default floor on the norm


def levy_phi(lam: Tensor) -> Tensor:
    """φ(Λ) = E[1{Z≥1}/Z] for Z ~ Poisson(Λ), elementwise for Λ ≥ 0 (docs/levy.md#the-function-phi).

    Evaluated in float64 and returned in the input's floating dtype (float64 for integer input).
    Λ ≥ 40: the asymptotic series Σ_{k=0}^{12} k!/Λ^{k+1} (the e^{-Λ}(γ + ln Λ) term is below
    1e-16 there). Λ < 40: φ = Λ Σ_{z=1}^{Z} exp((z−1) ln Λ − Λ − ln z!)/z, a sum of positive
    Poisson-pmf terms with the factor Λ pulled out, so that φ(0) = 0 exactly and φ'(0) = 1;
    Z = 160, or fewer (2·max Λ + 40) when every entry is small, the dropped tail being below
    1e-24 of the sum. The series is evaluated on Λ clamped to ≥ 40 and the sum on Λ clamped to
    ≥ 1e-300, so neither branch can produce an infinite or NaN gradient; the Poisson sum is
    evaluated only for the entries below 40 (it is the expensive branch) and merged by index.
    """
    out_dtype = lam.dtype if lam.is_floating_point() else torch.float64
    x = lam.to(torch.float64).reshape(-1)
    inv = x.clamp(min=_PHI_SWITCH).reciprocal()
    phi = torch.full_like(x, float(math.factorial(_PHI_ORDER)))
    for k in range(_PHI_ORDER - 1, -1, -1):  # Horner: 1/Λ (0! + 1/Λ (1! + 1/Λ (2! + …)))
        phi = phi * inv + math.factorial(k)
    phi = phi * inv
    below = x < _PHI_SWITCH
    if bool(below.any()):
        small = x[below]
        # terms beyond z = 2Λ + 40 are below 1e-24 of the sum; 160 covers Λ → 40
        terms = min(_PHI_TERMS, math.ceil(2 * float(small.detach().max()) + 40))
        z = torch.arange(1, terms + 1, dtype=torch.float64, device=x.device)
        clamped = small.clamp(min=_TINY)
        # log term_z = (z−1) ln Λ − Λ − ln(z·z!), as one [N, 3] @ [3, Z] product
        features = torch.stack([clamped.log(), clamped, torch.ones_like(clamped)], dim=-1)
        coefficients = torch.stack([z - 1, -torch.ones_like(z), -(torch.lgamma(z + 1) + z.log())])
        phi = phi.index_put((below,), small * (features @ coefficients).exp().sum(-1))
    return phi.reshape(lam.shape).to(out_dtype)


def _safe_sqrt(x: Tensor) -> Tensor:
    """sqrt with gradient 0 (not ∞) at 0, for σ̂ where trΣ_V = 0 (identical values)."""
    positive = x > 0
    return torch.where(positive, torch.where(positive, x, torch.ones_like(x)).sqrt(), torch.zeros_like(x))


class _UnitVectors(torch.autograd.Function):
    """x / max(‖x‖, 1e-12) along the last axis: the values of ``F.normalize(x, dim=-1)``.

    The backward is the closed form ∂x = (g − x̂ (x̂·g)) / ‖x‖ (just g / 1e-12 where the norm is
    clamped), a few passes over x instead of the separate backwards of the norm and the division
    that autograd runs for ``F.normalize``; the key directions are [B, H, n, d], so this is
    measurable in training.
    """

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=_NORM_EPS)
        unit = x / norm
        ctx.save_for_backward(unit, norm)
        return unit

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        unit, norm = ctx.saved_tensors
        radial = torch.where(norm > _NORM_EPS, (grad * unit).sum(-1, keepdim=True), 0.0)
        return (grad - unit * radial) / norm


def _axis_mass(x: Tensor, cells: int, eps: float) -> tuple[Tensor, Tensor]:
    """Exact mass of N(x, eps²) in each of ``cells`` equal bins of [0, 1], row-normalised.

    Returns (mass [..., cells] with rows summing to 1, log of the raw in-[0,1] mass [...]).
    Dividing by the in-range mass is the boundary renormalisation of docs/levy.md#mollifier-and-grid. Bins right of x
    use differences of upper tails, bins left of it differences of lower tails, so no mass is
    lost to Φ ≈ 1 cancellation.
    """
    edges = torch.linspace(0.0, 1.0, cells + 1, dtype=x.dtype, device=x.device)
    z = (edges - x.unsqueeze(-1)) / eps
    lower, upper = torch.special.ndtr(z), torch.special.ndtr(-z)
    mass = torch.where(z[..., :-1] > 0, upper[..., :-1] - upper[..., 1:], lower[..., 1:] - lower[..., :-1])
    total = mass.sum(-1, keepdim=True)
    return mass / total, total.squeeze(-1).log()


def _cell_features(grid: tuple[int, int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """[c_t − ½, c_u − ½, 1] for every cell centre, [L, 3], flat index l = j·L_v + k."""
    l_t, l_v = grid
    c_t = (torch.arange(l_t, dtype=dtype, device=device) + 0.5) / l_t - 0.5
    c_u = (torch.arange(l_v, dtype=dtype, device=device) + 0.5) / l_v - 0.5
    return torch.stack([c_t.repeat_interleave(l_v), c_u.repeat(l_t), torch.ones(l_t * l_v, dtype=dtype, device=device)], dim=-1)


def _key_features(t: Tensor, u: Tensor, log_z: Tensor, eps: tuple[float, float]) -> Tensor:
    """Key features ψ_i [..., 3] with ⟨cell features_l, ψ_i⟩ = −½‖c_l − s_i‖²_ε − log Z_i + f(l).

    Expanding the square around ½ leaves a bilinear form plus f(l) = −½‖c_l − ½‖²_ε, which
    depends on the cell only and cancels in a softmax over keys. Centring at ½ keeps the
    products small (|logit terms| ≤ 64 at the default ε), so float32 rounding perturbs the
    weights by ~1e-5 relative at most.
    """
    eps_t, eps_u = eps
    t, u = torch.broadcast_tensors(t - 0.5, u - 0.5)
    offset = -0.5 * (t.square() / eps_t**2 + u.square() / eps_u**2) - log_z
    return torch.stack([t / eps_t**2, u / eps_u**2, offset], dim=-1)


def _kron_rows(a: Tensor, b: Tensor) -> Tensor:
    """M_i,(j,k) = a_ij b_ik, l = j·L_v + k: a [B, n, Lt] (shared by the heads), b [B, H, n, Lv] → [B, H, n, L].

    Materialising the small t-factor per head first keeps the broadcast product on PyTorch's fast
    contiguous path (the all-broadcast form is several times slower).
    """
    a = a[:, None, :, :, None].expand(-1, b.shape[1], -1, -1, 1).contiguous()
    return (a * b[..., None, :]).flatten(-2)


_CELL_CHUNK = 1 << 18  # entries of M formed at a time by _CellAverage (1 MiB in float32)


class _CellAverage(torch.autograd.Function):
    """(A ⊗ B) @ X per key: out_i = Σ_l M_il X_l with M = _kron_rows(A, B); A [B, n, Lt], B [B, H, n, Lv], X [B, H, L, c].

    Same values as ``_kron_rows(a, b) @ x`` (up to float summation order), computed faster in two ways:

    * Both products with M are memory-bound (M is n × L per head, against n × c outputs and
      L × c inputs), so M is formed for a few samples at a time (about ``_CELL_CHUNK`` entries)
      and used while it is still in cache, instead of being written out whole and read back; the
      backward forms it again the same way rather than keeping it.
    * Internally the cells run k-major (l' = k·L_t + j): the broadcast product b_ik a_ij then has
      the longer axis L_t innermost, which vectorises better, and only the small X and ∂X are
      reordered.

    The backward is written by hand (autograd's backward of the broadcast product takes a slow
    strided path): ∂X = Mᵀ ∂out, and ∂A, ∂B are reductions of ∂M = ∂out Xᵀ over k and j.
    """

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, x: Tensor) -> Tensor:
        x = _CellAverage.k_major(x, a.shape[-1], b.shape[-1])
        ctx.save_for_backward(a, b, x)
        out = x.new_empty(*b.shape[:-1], x.shape[-1])
        for rows in _CellAverage.chunks(b, x):
            torch.matmul(_CellAverage.mass(a[rows], b[rows]), x[rows], out=out[rows])
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        a, b, x = ctx.saved_tensors
        need_a, need_b, need_x = ctx.needs_input_grad
        grad = grad.contiguous()
        grad_a = torch.empty_like(a) if need_a else None
        grad_b = b.new_empty(b.shape) if need_b else None
        grad_x = torch.empty_like(x) if need_x else None
        for rows in _CellAverage.chunks(b, x):
            if grad_x is not None:
                torch.matmul(_CellAverage.mass(a[rows], b[rows]).transpose(-1, -2), grad[rows], out=grad_x[rows])
            if grad_a is not None or grad_b is not None:
                # ∂M [rows, H, n, Lv, Lt]
                grad_mass = (grad[rows] @ x[rows].transpose(-1, -2)).unflatten(-1, (b.shape[-1], a.shape[-1]))
                if grad_a is not None:
                    torch.sum((grad_mass * b[rows, ..., None]).sum(-2), dim=1, out=grad_a[rows])
                if grad_b is not None:
                    torch.matmul(grad_mass, a[rows, None, :, :, None], out=grad_b[rows, ..., None])
        if grad_x is not None:
            grad_x = _CellAverage.k_major(grad_x, b.shape[-1], a.shape[-1])  # back to l = j·L_v + k
        return grad_a, grad_b, grad_x

    @staticmethod
    def mass(a: Tensor, b: Tensor) -> Tensor:
        """M with k-major cells, M_i,(k·L_t + j) = b_ik a_ij: a [rows, n, Lt], b [rows, H, n, Lv] → [rows, H, n, L]."""
        return (b[..., :, None] * a[:, None, :, None, :]).flatten(-2)

    @staticmethod
    def k_major(x: Tensor, outer: int, inner: int) -> Tensor:
        """Reorder the cell rows of x [..., L, c] from (outer, inner) to (inner, outer) order."""
        return x.unflatten(-2, (outer, inner)).transpose(-2, -3).flatten(-3, -2)

    @staticmethod
    def chunks(b: Tensor, x: Tensor) -> list[slice]:
        """Slices of the batch with about _CELL_CHUNK entries of M (H·n·L per sample) each."""
        step = max(1, _CELL_CHUNK // max(1, b.shape[1] * b.shape[2] * x.shape[-2]))
        return [slice(i, i + step) for i in range(0, b.shape[0], step)]


def fourier_time_features(t: Tensor, dim: int, max_frequency: float = 32.0) -> Tensor:
    """Fixed sinusoidal features of times t ∈ [0, 1]: [..., dim] (sin half, cos half).

    Frequencies are geometric from 1 to ``max_frequency`` cycles per unit time. The token
    encoder must add the same features to the keys for a query's time features to be
    comparable with theirs (docs/levy.md#action-head: queries carry time only through their embedding).
    """
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    freqs = torch.logspace(0.0, math.log10(max_frequency), dim // 2, dtype=t.dtype, device=t.device)
    angles = 2 * math.pi * t.unsqueeze(-1) * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


@dataclass(frozen=True)
class LevyAttentionConfig:
    """Settings of :class:`LevyCrossAttention` (docs/levy.md#choices-and-switches).

    ``identity_dim`` = 128 reproduces the paper's 516 extra parameters at 4 heads
    (4 × (128 + 1)). ``beta`` is the fixed kernel sharpness and ``tau`` the fixed Poisson rate
    (a multiplier on the intensity: it scales Λ and cancels from ā and trΣ_V). ``grid`` is
    (L_t, L_v), ``eps`` the mollifier standard deviations (ε_t, ε_v). ``query_chunk`` bounds the
    memory of the m × n kernel (and, when sampling, of the K × m × L counts) per pass.
    """

    embed_dim: int = 128
    num_heads: int = 4
    identity_dim: int = 128
    grid: tuple[int, int] = (16, 8)
    eps: tuple[float, float] = (1 / 16, 1 / 8)
    beta: float = 1.0
    tau: float = 1.0
    query_chunk: int = 1024

    def __post_init__(self) -> None:
        if self.embed_dim < 1 or self.num_heads < 1 or self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be a positive multiple of num_heads ({self.num_heads})")
        if self.embed_dim // self.num_heads < 3:
            raise ValueError(
                f"head dimension must be >= 3 (it carries the 3 value-field features), got {self.embed_dim // self.num_heads}"
            )
        if self.identity_dim < 1:
            raise ValueError(f"identity_dim must be >= 1, got {self.identity_dim}")
        if len(self.grid) != 2 or min(self.grid) < 1:
            raise ValueError(f"grid must be two positive cell counts (L_t, L_v), got {self.grid}")
        if len(self.eps) != 2 or min(self.eps) <= 0:
            raise ValueError(f"eps must be two positive standard deviations (eps_t, eps_v), got {self.eps}")
        if not 0 < self.beta <= MAX_SHARPNESS:
            raise ValueError(f"beta must lie in (0, {MAX_SHARPNESS:g}], got {self.beta}")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        if self.query_chunk < 1:
            raise ValueError(f"query_chunk must be >= 1, got {self.query_chunk}")

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads


@dataclass(frozen=True)
class LevyOutput:
    """What :meth:`LevyCrossAttention.forward` returns.

    ``output`` [B, m, E] is W_O applied to the concatenated per-head mean paths ā. The signals
    are head means [B, m] (docs/levy.md#heads); the ``*_heads`` fields [B, m, H] hold them per
    head. ``empty_history`` [B] marks samples that had no valid key and attended to the neutral
    token only: their σ̂ is not trustworthy (report "unknown" there).
    """

    output: Tensor
    evidence: Tensor
    disagreement: Tensor
    deviation: Tensor
    empty_history: Tensor
    evidence_heads: Tensor
    disagreement_heads: Tensor
    deviation_heads: Tensor


@dataclass(frozen=True)
class _Keys:
    """Query-independent per-head quantities, computed once per call ([B, H, ...])."""

    directions: Tensor  # unit key vectors k̂ [B, H, n, d]
    time_mass: Tensor  # A, row-normalised cell masses along t, padded rows zeroed [B, n, Lt]
    channel_mass: Tensor  # B, the same along u [B, H, n, Lv]; M = A ⊗ B row by row
    centre: Tensor  # c, mean of the value field over the cells [B, H, 1, d]
    deviations: Tensor  # D = V − c, the centred value field [B, H, L, d]
    attn_keys: Tensor  # [k̂, 0, 0, 0, 0] and the zero reference key [B, H, n + 1, d + 4]
    attn_values: Tensor  # [ṽ − c, w, ΣM, 0, 0] and the reference row e_{d+2} [B, H, n + 1, d + 4]
    attn_mask: Tensor | None  # valid keys and the reference key [B, 1, 1, n + 1]
    empty: Tensor  # [B] bool


class LevyCrossAttention(nn.Module):
    """Lévy cross-attention from m queries to n keys (docs/levy.md).

    Inputs: ``queries`` [B, m, E]; ``tokens`` [B, n, E] (keys and values); ``times`` [B, n] in
    [0, 1]; ``identity`` [B, n, D] or [n, D] (the key identity vectors e_i); ``mask`` [B, n] bool,
    True for valid keys (None: all valid). Padded keys have no effect at all (their kernel weight
    is 0, their value-field logit −∞, their row of M zero), provided their tokens and identities
    are finite, as in any masked attention; their times may be anything.

    Parameters: the Q/K/V/O projections of a standard multi-head softmax cross-attention, plus
    ``chan = Linear(D, H)`` (u = sigmoid(chan(e)), one channel coordinate per head) and the
    neutral token (an E-vector and a D-vector) for empty histories.
    """

    def __init__(self, config: LevyAttentionConfig | None = None) -> None:
        super().__init__()
        self.config = config or LevyAttentionConfig()
        e, h, d_id = self.config.embed_dim, self.config.num_heads, self.config.identity_dim
        self.q_proj = nn.Linear(e, e)
        self.k_proj = nn.Linear(e, e)
        self.v_proj = nn.Linear(e, e)
        self.out_proj = nn.Linear(e, e)
        self.chan = nn.Linear(d_id, h)
        self.neutral_token = nn.Parameter(0.02 * torch.randn(e))
        self.neutral_identity = nn.Parameter(torch.zeros(d_id))

    # ------------------------------------------------------------------ public API

    def forward(self, queries: Tensor, tokens: Tensor, times: Tensor, identity: Tensor, mask: Tensor | None = None) -> LevyOutput:
        """Mean path and the three signals for every query (the training path)."""
        self._check_inputs(queries, tokens, times, identity, mask)
        keys = self._prepare_keys(tokens, times, identity, mask)
        directions = self._query_directions(queries)
        chunks = directions.split(self.config.query_chunk, dim=2)
        parts = [self._mean_signals(c, keys) for c in chunks]
        abar, evidence, disagreement = (torch.cat(p, dim=2) for p in zip(*parts))
        deviation = _safe_sqrt(disagreement * levy_phi(evidence))
        heads = [x.transpose(1, 2) for x in (evidence, disagreement, deviation)]  # [B, m, H]
        return LevyOutput(
            output=self._merge_heads(abar),
            evidence=heads[0].mean(-1),
            disagreement=heads[1].mean(-1),
            deviation=heads[2].mean(-1),
            empty_history=keys.empty,
            evidence_heads=heads[0],
            disagreement_heads=heads[1],
            deviation_heads=heads[2],
        )

    def sample(
        self,
        queries: Tensor,
        tokens: Tensor,
        times: Tensor,
        identity: Tensor,
        mask: Tensor | None = None,
        *,
        draws: int,
        generator: torch.Generator | None = None,
        straight_through: bool = False,
    ) -> Tensor:
        """K draws of the sampled layer, [K, B, m, E], after the output projection.

        Keys, kernel, λ and the value field are computed once; only the cell counts
        N_l ~ Poisson(λ_l) are redrawn (docs/levy.md#sampled-layer, "K-draw mode"), then a = Σ N_l V_l / Σ N_l per
        head (ā where no count falls), heads concatenated and W_O applied. W_O is affine, so
        Theorem 1 (E[a] = ā) carries over unchanged; Theorem 2 holds in projected form,
        E‖W(a − ā)‖² = φ(Λ) Σ_l p_l ‖W(V_l − ā)‖² (per head, summed over independent heads).
        Sampling carries no gradient; ``straight_through=True`` returns ā + (a − ā).detach(),
        whose gradient is that of the mean path.
        """
        if draws < 1:
            raise ValueError(f"draws must be >= 1, got {draws}")
        self._check_inputs(queries, tokens, times, identity, mask)
        with torch.set_grad_enabled(straight_through and torch.is_grad_enabled()):
            keys = self._prepare_keys(tokens, times, identity, mask)
            directions = self._query_directions(queries)
            chunks = directions.split(self.config.query_chunk, dim=2)
            parts = [self._sample_chunk(c, keys, draws, generator) for c in chunks]
            abar, sampled = (torch.cat(p, dim=-2) for p in zip(*parts))
            if straight_through:
                sampled = abar + (sampled - abar).detach()
            return self._merge_heads(sampled)

    def cell_intensity(
        self, queries: Tensor, tokens: Tensor, times: Tensor, identity: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """Cell intensities λ_l(q) = τ Σ_i κ(q, k_i) M_il per head, [B, H, m, L], l = j·L_v + k.

        The query's attention mass laid out over the index space (a diagnostic, and the sampler's
        Poisson rates); Σ_l λ_l = Λ on any grid.
        """
        self._check_inputs(queries, tokens, times, identity, mask)
        keys = self._prepare_keys(tokens, times, identity, mask)
        chunks = self._query_directions(queries).split(self.config.query_chunk, dim=2)
        return torch.cat([self._rates(c, keys) for c in chunks], dim=2)

    # ------------------------------------------------------------------ internals

    def _check_inputs(self, queries: Tensor, tokens: Tensor, times: Tensor, identity: Tensor, mask: Tensor | None) -> None:
        """Shape and range checks with errors that name the offending argument."""
        e, d_id = self.config.embed_dim, self.config.identity_dim
        if queries.dim() != 3 or queries.shape[-1] != e:
            raise ValueError(f"queries must have shape [B, m, {e}], got {tuple(queries.shape)}")
        if tokens.dim() != 3 or tokens.shape[-1] != e or tokens.shape[0] != queries.shape[0]:
            raise ValueError(f"tokens must have shape [B={queries.shape[0]}, n, {e}], got {tuple(tokens.shape)}")
        b, n = tokens.shape[:2]
        if times.shape != (b, n):
            raise ValueError(f"times must have shape [B, n] = {(b, n)}, got {tuple(times.shape)}")
        if identity.shape not in ((b, n, d_id), (n, d_id)):
            raise ValueError(
                f"identity must have shape [B, n, D] = {(b, n, d_id)} or [n, D] = {(n, d_id)}, got {tuple(identity.shape)}"
            )
        if mask is not None and (mask.shape != (b, n) or mask.dtype != torch.bool):
            raise ValueError(f"mask must be a bool tensor of shape [B, n] = {(b, n)}, got {mask.dtype} {tuple(mask.shape)}")
        bad = ~((times >= 0) & (times <= 1))  # also catches NaN
        if mask is not None:
            bad &= mask
        if bool(bad.any()):
            raise ValueError("times of valid keys must lie in [0, 1]")

    def _with_neutral_token(
        self, tokens: Tensor, times: Tensor, identity: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
        """Append the neutral token, valid only for samples without valid keys.

        It is appended only when some sample needs it; elsewhere it would be masked out anyway
        (κ = 0, logit −∞), so the results are identical either way.
        """
        b, n, _ = tokens.shape
        if mask is None:
            if n > 0:
                return tokens, times, identity, None, torch.zeros(b, dtype=torch.bool, device=tokens.device)
            mask = torch.zeros(b, 0, dtype=torch.bool, device=tokens.device)
        empty = ~mask.any(dim=1)
        if not bool(empty.any()):
            return tokens, times, identity, mask, empty
        tokens = torch.cat([tokens, self.neutral_token.to(tokens.dtype).expand(b, 1, -1)], dim=1)
        times = torch.cat([times, times.new_ones(b, 1)], dim=1)
        neutral_id = self.neutral_identity.to(identity.dtype)
        if identity.dim() == 2:
            identity = torch.cat([identity, neutral_id[None]], dim=0)
        else:
            identity = torch.cat([identity, neutral_id.expand(b, 1, -1)], dim=1)
        return tokens, times, identity, torch.cat([mask, empty[:, None]], dim=1), empty

    def _split_heads(self, x: Tensor) -> Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.config.num_heads, self.config.head_dim).transpose(1, 2)

    def _merge_heads(self, x: Tensor) -> Tensor:
        """[..., H, m, d] → W_O(concat heads) [..., m, E]."""
        return self.out_proj(x.transpose(-2, -3).flatten(-2))

    def _query_directions(self, queries: Tensor) -> Tensor:
        """β-scaled unit query vectors per head [B, H, m, d], so that κ = exp(q̂·k̂)."""
        return self.config.beta * _UnitVectors.apply(self._split_heads(self.q_proj(queries)))

    def _prepare_keys(self, tokens: Tensor, times: Tensor, identity: Tensor, mask: Tensor | None) -> _Keys:
        """Everything that does not depend on the queries: key directions, M, value field, ṽ, w."""
        config = self.config
        tokens, times, identity, mask, empty = self._with_neutral_token(tokens, times.to(tokens.dtype), identity, mask)
        if mask is not None:  # padded times may be anything; tokens and identities must be finite
            times = times.masked_fill(~mask, 0.0)
        b, n, _ = tokens.shape
        h, d = config.num_heads, config.head_dim
        directions = _UnitVectors.apply(self._split_heads(self.k_proj(tokens)))
        values = self._split_heads(self.v_proj(tokens))  # [B, H, n, d]
        # u [B, H, n], or [1, H, n] when the identities are shared by the batch ([n, D]): then so
        # are the masses along u, computed once and broadcast
        u = torch.sigmoid(self.chan(identity)).transpose(-1, -2)
        u = u if u.dim() == 3 else u[None]
        attn_mask = None if mask is None else mask[:, None, None, :]

        mass_t, log_z_t = _axis_mass(times, config.grid[0], config.eps[0])  # [B, n, Lt]: shared by the heads
        mass_u, log_z_u = _axis_mass(u, config.grid[1], config.eps[1])  # [B or 1, H, n, Lv]
        mass_u = mass_u.expand(b, -1, -1, -1)
        if mask is not None:
            mass_t = mass_t * mask[..., None]  # zero rows of M for padded keys

        # Value field V = W v, W_li = softmax_i(−½‖c_l − s_i‖²_ε − log Z_i): a softmax attention from
        # the cells to the keys with bilinear logits (see _key_features), run by the fused kernel.
        cells = F.pad(_cell_features(config.grid, tokens.dtype, tokens.device), (0, d - 3))
        key_features = F.pad(_key_features(times[:, None], u, log_z_t[:, None] + log_z_u, config.eps), (0, d - 3))
        field = F.scaled_dot_product_attention(cells.expand(b, h, -1, -1), key_features, values, attn_mask=attn_mask, scale=1.0)
        centre = field.mean(dim=-2, keepdim=True)
        deviations = field - centre
        # Query-side attention operands: κ = exp(β q̂·k̂) is a softmax numerator with scale 1. The
        # zero reference key has logit 0 (weight 1) for every query, so the attention output holds
        # Σκ x / (1 + Σκ) for every value column x. Value columns per key: [ṽ − c, w, ΣM = 1
        # (0 for padded keys), 0, 0], all from one product M @ [D, ‖D‖², 1, 0, 0] (the zero columns
        # keep the width a multiple of 4, which the kernels need to stay fast); the reference key's
        # row is e_{d+2}. The "valid" column gives Σκ/(1 + Σκ), the indicator 1/(1 + Σκ), and their
        # ratio Σκ without cancellation.
        columns = [deviations, deviations.square().sum(-1, keepdim=True), torch.ones_like(deviations[..., :1])]
        summary = _CellAverage.apply(mass_t, mass_u, F.pad(torch.cat(columns, dim=-1), (0, 2)))  # [B, H, n, d + 4]
        reference = torch.zeros(d + 4, dtype=summary.dtype, device=summary.device)
        reference[d + 2] = 1.0
        attn_values = torch.cat([summary, reference.expand(b, h, 1, -1)], dim=2)
        attn_keys = F.pad(directions, (0, 4, 0, 1))
        if attn_mask is not None:
            attn_mask = F.pad(attn_mask, (0, 1), value=True)
        return _Keys(directions, mass_t, mass_u, centre, deviations, attn_keys, attn_values, attn_mask, empty)

    def _mean_signals(self, directions: Tensor, keys: _Keys) -> tuple[Tensor, Tensor, Tensor]:
        """ā [B, H, mc, d], Λ and trΣ_V [B, H, mc] for one chunk of β-scaled query directions.

        Per-key form (docs/levy.md#centred-disagreement): ā − c = Σ π_i (ṽ_i − c), Σ_l p_l ‖D_l‖² = Σ π_i w_i with
        π = κ/Σκ, all read off one fused attention call (see :meth:`_prepare_keys`).
        """
        d = self.config.head_dim
        out = F.scaled_dot_product_attention(
            F.pad(directions, (0, 4)), keys.attn_keys, keys.attn_values, attn_mask=keys.attn_mask, scale=1.0
        )
        valid, reference = out[..., d + 1], out[..., d + 2]
        offset = out[..., :d] / valid[..., None]  # ā − c
        disagreement = (out[..., d] / valid - offset.square().sum(-1)).clamp(min=0)
        return keys.centre + offset, self.config.tau * valid / reference, disagreement

    def _rates(self, directions: Tensor, keys: _Keys) -> Tensor:
        """λ = τ κ M [B, H, mc, L] for one chunk of β-scaled query directions (padded rows of M are 0)."""
        kernel = torch.exp(directions @ keys.directions.transpose(-1, -2))  # κ/τ [B, H, mc, n]
        return self.config.tau * (kernel @ _kron_rows(keys.time_mass, keys.channel_mass))

    def _sample_chunk(
        self, directions: Tensor, keys: _Keys, draws: int, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        """(ā [B, H, mc, d], K draws [K, B, H, mc, d]) for one chunk of β-scaled query directions."""
        abar = self._mean_signals(directions, keys)[0]
        rates = self._rates(directions, keys)
        counts = poisson_on(rates.detach().expand(draws, *rates.shape).contiguous(), generator)
        total = counts.sum(-1, keepdim=True)
        sampled = keys.centre + (counts @ keys.deviations) / total.clamp(min=1)
        return abar, torch.where(total > 0, sampled, abar)


@dataclass(frozen=True)
class LevyActionHeadConfig:
    """Settings of :class:`LevyActionHead`: one learned query per action (docs/levy.md#action-head)."""

    attention: LevyAttentionConfig = field(default_factory=LevyAttentionConfig)
    num_actions: int = 2
    hidden_dim: int = 64
    max_frequency: float = 32.0

    def __post_init__(self) -> None:
        if self.num_actions < 1 or self.hidden_dim < 1:
            raise ValueError(f"num_actions and hidden_dim must be >= 1, got {self.num_actions}, {self.hidden_dim}")


@dataclass(frozen=True)
class LevyActionOutput:
    """``action`` [B, A] (the predicted action means) and the attention output for the A
    per-action queries, whose signals ([B, A]) are therefore per action."""

    action: Tensor
    attention: LevyOutput


class LevyActionHead(nn.Module):
    """Per-action queries into a :class:`LevyCrossAttention`, and a small MLP per action.

    Query k = learned action embedding + Fourier features of t = 1 (the present; no index-space
    position, docs/levy.md#index-space). Each action therefore gets its own ā_k, Λ_k, trΣ_V,k and σ̂_k. The MLP
    of action k maps ā_k + q_k (residual) to the action mean; the A MLPs run as one batched
    einsum.
    """

    def __init__(self, config: LevyActionHeadConfig | None = None) -> None:
        super().__init__()
        self.config = config or LevyActionHeadConfig()
        e, a, hidden = self.config.attention.embed_dim, self.config.num_actions, self.config.hidden_dim
        self.attention = LevyCrossAttention(self.config.attention)
        self.action_embedding = nn.Parameter(0.02 * torch.randn(a, e))
        now = fourier_time_features(torch.ones(()), e, self.config.max_frequency)
        self.register_buffer("time_features", now, persistent=False)
        bound_in, bound_hidden = 1 / math.sqrt(e), 1 / math.sqrt(hidden)  # nn.Linear's default init
        self.w1 = nn.Parameter(torch.empty(a, e, hidden).uniform_(-bound_in, bound_in))
        self.b1 = nn.Parameter(torch.empty(a, hidden).uniform_(-bound_in, bound_in))
        self.w2 = nn.Parameter(torch.empty(a, hidden).uniform_(-bound_hidden, bound_hidden))
        self.b2 = nn.Parameter(torch.empty(a).uniform_(-bound_hidden, bound_hidden))

    def queries(self, batch: int) -> Tensor:
        """The A action queries for a batch, [B, A, E]."""
        return (self.action_embedding + self.time_features).expand(batch, -1, -1)

    def forward(self, tokens: Tensor, times: Tensor, identity: Tensor, mask: Tensor | None = None) -> LevyActionOutput:
        queries = self.queries(tokens.shape[0])
        attended = self.attention(queries, tokens, times, identity, mask)
        return LevyActionOutput(self._mlp(attended.output, queries), attended)

    def sample(
        self,
        tokens: Tensor,
        times: Tensor,
        identity: Tensor,
        mask: Tensor | None = None,
        *,
        draws: int,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """K sampled actions [K, B, A]: the layer's draws pushed through the (nonlinear) MLPs."""
        queries = self.queries(tokens.shape[0])
        with torch.no_grad():
            attended = self.attention.sample(queries, tokens, times, identity, mask, draws=draws, generator=generator)
            return self._mlp(attended, queries)

    def _mlp(self, attended: Tensor, queries: Tensor) -> Tensor:
        """Action k's MLP on ā_k + q_k: [..., A, E] → [..., A]."""
        hidden = F.gelu(torch.einsum("...ae,aeh->...ah", attended + queries, self.w1) + self.b1)
        return torch.einsum("...ah,ah->...a", hidden, self.w2) + self.b2
