"""One variance: every Gaussian head reports the variance its training loss was computed with.

With the target equal to the predicted mean, a Gaussian NLL term is ½(log 2π + log V), so the
loss returns the mean log-variance it used: 2·NLL − log 2π. ``predict`` on the same batch and the
same draws (the global RNG reseeded; one draw where training takes one) must report that
variance as its aleatoric part. NSAC's loss adds ε = 1e-3 to every draw's variance; before this
was reported too, 89 % of the demo run's steering variances lay below the floor it trained with.
"""

from __future__ import annotations

import math

import pytest
import torch

from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.objectives import NSACObjective
from nsacdrive.controllers.registry import build_controller

#: draws per prediction = draws per training loss, so both see the same random stream
DRAWS = {"nsac": 3, "mcdropout": 1, "sdenet": 1, "gmle": 1, "levy": 1}


def head_and_batch(name: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    config = ModelConfig(model=name, encoder=EncoderConfig(token_dim=16, channels=(8, 16, 16)), d_model=16, num_heads=4,
                         topk=4, train_samples=DRAWS[name], predict_samples=DRAWS[name], sde_depth=3, levy_frames=4)
    torch.manual_seed(0)
    head = build_controller(config).head.eval()
    tokens = torch.randn(6, 4, 16)
    times = torch.linspace(-0.12, 0.0, 4).expand(6, 4)
    return head, tokens, times


def loss_log_variance(head, tokens, times, mean: torch.Tensor) -> torch.Tensor:
    """The mean log-variance of the head's NLL term at target = ``mean``."""
    perturbed = tokens + 0.5 * torch.randn(tokens.shape, generator=torch.Generator().manual_seed(1))
    terms = head.training_loss(tokens, times, mean, perturbed)
    return 2 * terms.get("nll", terms["total"]) - math.log(2 * math.pi)


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_predict_reports_the_variance_the_loss_used(name):
    head, tokens, times = head_and_batch(name)
    if name == "mcdropout":
        head.train()  # its loss draws dropout masks in training mode, as predict forces them
    with torch.no_grad():
        torch.manual_seed(7)
        prediction = head.predict(tokens, times, DRAWS[name])
        torch.manual_seed(7)
        from_loss = loss_log_variance(head, tokens, times, prediction.mean)
    reported = prediction.aleatoric.log().mean()
    # float32: each log V carries ~1e-7 relative rounding; the mean of 18 terms and the NLL's sums stay far below 1e-5
    assert abs(float(from_loss - reported)) < 1e-5, (name, float(from_loss), float(reported))


def test_nsac_reports_its_loss_floor_even_where_the_network_variance_is_far_below_it():
    head, tokens, times = head_and_batch("nsac")
    with torch.no_grad():
        head.layer.log_sigma_head.bias.fill_(-8.0)  # e^{2ℓ} ≈ 1e-7, four orders below ε
        prediction = head.predict(tokens, times, DRAWS["nsac"])
    assert torch.all(prediction.aleatoric >= NSACObjective().epsilon)
