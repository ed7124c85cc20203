"""Training precision (:mod:`nsacdrive.controllers.precision`): the encoders' convolutions in bfloat16
under autocast, within bfloat16's rounding of float32, the tokens in float32 (the trainer's side is
in test_training.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from float_paths import UNIT_ROUNDOFF, reduction_lengths
from torch import nn

from nsacdrive.controllers.encoders import ENCODERS, EncoderConfig
from nsacdrive.controllers.precision import set_encoder_precision

BFLOAT16_ROUNDOFF = 2.0**-8  # unit roundoff of bfloat16's 8-bit significand


def encoder_and_frames(kind: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    config = EncoderConfig(kind=kind, token_dim=16, channels=(8, 16, 16))
    encoder = ENCODERS[kind](config).eval()
    return encoder, torch.rand(2, 3, *config.frame_shape)


def convolution_dtypes(encoder: nn.Module, frames: torch.Tensor) -> tuple[set[torch.dtype], torch.Tensor]:
    """The dtypes every convolution of ``encoder`` produced, and its tokens, for one forward pass."""
    dtypes: set[torch.dtype] = set()
    hooks = [module.register_forward_hook(lambda _m, _i, output: dtypes.add(output.dtype))
             for module in encoder.modules() if isinstance(module, nn.Conv2d)]
    try:
        with torch.no_grad():
            return dtypes, encoder(frames)
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("kind", sorted(ENCODERS))
def test_bfloat16_runs_every_convolution_in_bfloat16_and_hands_on_float32_tokens(kind):
    encoder, frames = encoder_and_frames(kind)
    with torch.no_grad():
        reference = encoder(frames)
    set_encoder_precision(encoder, "bfloat16")
    dtypes, tokens = convolution_dtypes(encoder, frames)
    assert dtypes == {torch.bfloat16}
    assert tokens.dtype == torch.float32 and tokens.shape == reference.shape
    assert not torch.equal(tokens, reference)  # rounded somewhere: the setting took effect
    set_encoder_precision(encoder, "float32")
    dtypes, tokens = convolution_dtypes(encoder, frames)
    assert dtypes == {torch.float32}
    assert torch.equal(tokens, reference)  # back to the very float32 path


def test_a_bfloat16_convolution_is_within_bfloat16_rounding_of_float32():
    """Autocast rounds the frame and the weights to bfloat16 (relative error ≤ u each, u = 2⁻⁸), adds the
    exact products in float32 and rounds the sum to bfloat16, so per output
    |y_bf16 − y| ≤ (2u + u² + γ_n)·(|w| ∗ |x|) + u·|b| + u·|y_bf16|/(1 − u), γ_n = n·2⁻²⁴ (Higham §3.1)."""
    encoder, frames = encoder_and_frames("cnn")
    conv = encoder.features[0]
    images = frames.flatten(0, 1)
    set_encoder_precision(encoder, "bfloat16")
    captured: list[torch.Tensor] = []
    hook = conv.register_forward_hook(lambda _m, _i, output: captured.append(output))
    with torch.no_grad():
        encoder(frames)
        exact = F.conv2d(images.double(), conv.weight.double(), conv.bias.double(), conv.stride)
        magnitude = F.conv2d(images.double().abs(), conv.weight.double().abs(), None, conv.stride)
    hook.remove()
    low = captured[0].double()
    (terms,) = reduction_lengths(conv)
    u = BFLOAT16_ROUNDOFF
    bound = ((2 * u + u * u + terms * UNIT_ROUNDOFF) * magnitude + u * conv.bias.double().abs()[:, None, None]
             + u / (1 - u) * low.abs())
    assert torch.all((low - exact).abs() <= bound)
    assert (low - exact).abs().max() > 0  # and it did round
