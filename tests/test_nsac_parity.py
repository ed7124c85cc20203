"""Optional parity oracle: reference-mode NSAC vs torch-nac 0.0.2 with ported weights, zero noise.

Skipped unless torch-nac is installed (``make bench-deps`` installs it without dependencies;
it is never vendored). It validates faithfulness to the published layer, not correctness:
same author, same bugs (docs/nsac.md#parity-oracle). Weights are ported by the mapping described there: the q/k/v cells
are affine per time step, so their effective (W, c) are read off by probing with basis inputs;
the backbone's constants are r_k = b[k]·w_out,k + b_out,k.
"""

from __future__ import annotations

import pytest
import torch

torch_nac_layers = pytest.importorskip("torch_nac.layers")

from float_paths import assert_paths_agree, path_rtol

from nsacdrive.controllers.nsac import NSAC, NSACConfig  # noqa: E402

D_MODEL, HEADS, INPUT, OUTPUT = 16, 4, 12, 3


def affine_map(function, n_inputs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [out, in], c [out]) of an affine per-time-step map, by probing with basis vectors."""
    with torch.no_grad():
        probes = torch.cat([torch.zeros(1, n_inputs), torch.eye(n_inputs)])[None]  # [1, 1 + in, in]
        responses = function(probes)[0]
    offset = responses[0]
    return (responses[1:] - offset).T, offset


def port(theirs, ours: NSAC) -> None:
    with torch.no_grad():
        for name in ("query", "key", "value"):
            weight, bias = affine_map(getattr(theirs.nac, f"{name[0]}_proj"), INPUT)
            getattr(ours.core, name).weight.copy_(weight)
            getattr(ours.core, name).bias.copy_(bias)
        gates = theirs.nac.time_ab
        ours.core.gate_a.weight.copy_(gates.weight[0:1])
        ours.core.gate_a.bias.copy_(gates.bias[0:1])
        ours.core.gate_b.weight.copy_(gates.weight[1:2])
        ours.core.gate_b.bias.copy_(gates.bias[1:2])
        cell = theirs.ncp_out.cell
        ours.backbone.bias[:3].copy_(cell.bias[:3])
        ours.backbone.output_scale.copy_(cell.output_w)
        ours.backbone.output_shift.copy_(cell.output_b)
        ours.projection.load_state_dict(theirs.attention_out_proj.state_dict())
        ours.mean_head.load_state_dict(theirs.mean_head.state_dict())
        ours.log_sigma_head.load_state_dict(theirs.std_head.state_dict())


@pytest.mark.parametrize("length,topk", [(4, 8), (9, 4), (16, 6)])
def test_reference_mode_matches_torch_nac_with_ported_weights(length, topk):
    torch.manual_seed(0)
    theirs = torch_nac_layers.OUWrap(torch_nac_layers.NAC(D_MODEL, HEADS, topk=topk, input_dim=INPUT), output_dim=OUTPUT, bn_std=0.0)
    with torch.no_grad():  # move the backbone off its all-zero initial constants
        theirs.ncp_out.cell.bias.normal_()
        theirs.ncp_out.cell.output_w.normal_()
    ours = NSAC(NSACConfig(input_dim=INPUT, d_model=D_MODEL, num_heads=HEADS, topk=topk, output_dim=OUTPUT,
                           mode="reference", bn_std=0.0, activation="identity"))
    port(theirs, ours)
    x = torch.randn(5, length, INPUT, generator=torch.Generator().manual_seed(length))
    their_mean, their_log_sigma = theirs(x)[:2]
    out = ours(x)
    # another implementation of the same arithmetic: float32 rounding apart (tests/float_paths.py)
    rtol = path_rtol(ours, length)
    assert_paths_agree(out.mean[0], their_mean, rtol, "mean")
    assert_paths_agree(out.log_sigma[0], their_log_sigma, rtol, "log_sigma")
