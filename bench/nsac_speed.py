"""NSAC speed: batched Monte Carlo vs deterministic inference, and our layer vs torch-nac.

1. Inference with uncertainty (S = 20 draws batched inside the NSAC head) vs deterministic
   inference (one noise-free pass) of the SAME controller — a small per-frame CNN over T = 4
   preprocessed 84×96 frames feeding NSAC — at batch 1 and 64; the published approach
   (S full passes of CNN + head) is timed alongside. Target: ≤ 1.5× (published: ~20×).
   The same comparison for the quality recipe's NSAC (``configs/quality.json --model nsac``: CNN encoder with
   the speed input and NSAC head): deterministic = one noise-free pass; with uncertainty =
   ``Controller.predict`` with S = 20 and the feature-density score attached, as every
   closed-loop step of a calibrated run computes it — over the tokens, and over the tokens and
   every convolution's channel statistics (``calibrate --density-source tokens+conv``). Target:
   ≤ 1.5×.
2. NSAC layer forward+backward vs torch-nac 0.0.2's OUWrap at d = 64, H = 16, K = 8 on
   (B = 64, T = 4) and (B = 8, T = 256), if torch-nac is installed (``make bench`` tries
   ``pip install --no-deps torch-nac==0.0.2 ncps==1.0.1``; it is never vendored). Both our
   reference mode (same behaviour) and corrected mode are timed. Target: ≥ 10× faster.

One thread (torch.set_num_threads(1)) so the ratios are not distorted by the other core;
medians over repeats. Usage: ``python -m bench.nsac_speed [--quick]``.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from bench.common import median_time, paired_median_ratio
from nsacdrive.common.atomic import atomic_write_json
from nsacdrive.controllers.density import ConvStatistics, attach_density, fit_density
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.nsac import NSAC, NSACConfig
from nsacdrive.controllers.registry import build_controller

ROOT = Path(__file__).resolve().parents[1]


class FrameEncoder(nn.Module):
    """Stand-in per-frame CNN (3 convs, 8×8 stride-4 first): frames [B, T, 3, 84, 96] → [B, T, 64]."""

    def __init__(self, features: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, features),
        )

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        batch, length = frames.shape[:2]
        return self.net(frames.flatten(0, 1)).view(batch, length, -1)


def inference_overhead(batch: int, samples: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    encoder = FrameEncoder().eval()
    head = NSAC(NSACConfig(input_dim=64, d_model=64, num_heads=16, topk=8, output_dim=3)).eval()
    frames = torch.rand(batch, 4, 3, 84, 96)

    @torch.no_grad()
    def deterministic() -> None:
        head(encoder(frames), noise=False)

    @torch.no_grad()
    def batched_mc() -> None:
        head.predict(encoder(frames), samples=samples)

    @torch.no_grad()
    def published_mc() -> None:
        for _ in range(samples):
            head(encoder(frames))

    base = median_time(deterministic, repeats)
    ours = median_time(batched_mc, repeats)
    published = median_time(published_mc, max(repeats // 4, 2))
    return {"batch": batch, "deterministic_ms": base * 1e3, "batched_mc_ms": ours * 1e3,
            "published_mc_ms": published * 1e3, "batched_ratio": ours / base, "published_ratio": published / base}


def controller_overhead(batch: int, samples: int, repeats: int, source: str) -> dict[str, float | str]:
    """The quality recipe's controller: noise-free pass vs S-draw prediction + the density score over ``source``."""
    torch.manual_seed(0)
    config = ModelConfig(model="nsac", speed_input=True)
    controller = build_controller(config).eval()
    width = config.encoder.token_dim + (ConvStatistics(controller.encoder).width if source == "tokens+conv" else 0)
    attach_density(controller, fit_density(torch.randn(4 * width, width), (0,), "bench", source))
    frames = torch.rand(batch, 4, *config.encoder.frame_shape)
    timestamps = torch.arange(4.0).expand(batch, 4) * 0.04
    speed = torch.full((batch, 4), 30.0)

    @torch.no_grad()
    def deterministic() -> None:
        tokens = controller.tokens(frames, speed)
        controller.head.layer(tokens, controller.token_times(timestamps), noise=False)

    def with_uncertainty() -> None:
        controller.predict(frames, timestamps, samples=samples, speed=speed)

    base, ours, ratio = paired_median_ratio(deterministic, with_uncertainty, repeats)
    return {"batch": batch, "density_source": source, "deterministic_ms": base * 1e3, "uncertain_ms": ours * 1e3, "ratio": ratio}


def layer_speed(batch: int, length: int, repeats: int) -> dict[str, float | str]:
    x = torch.randn(batch, length, 64)
    out: dict[str, float | str] = {"batch": batch, "length": length}

    def fwd_bwd(layer: nn.Module, call: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            layer.zero_grad(set_to_none=True)
            call(x).sum().backward()
        return run

    for mode in ("reference", "corrected"):
        torch.manual_seed(0)
        ours = NSAC(NSACConfig(input_dim=64, d_model=64, num_heads=16, topk=8, output_dim=1, mode=mode))

        def our_call(v: torch.Tensor, layer: NSAC = ours) -> torch.Tensor:
            prediction = layer(v)
            return prediction.mean + prediction.log_sigma

        out[f"ours_{mode}_ms"] = median_time(fwd_bwd(ours, our_call), repeats) * 1e3
    if importlib.util.find_spec("torch_nac") is None:
        out["torch_nac_ms"] = "not installed"
        return out
    from torch_nac.layers import NAC as TorchNAC
    from torch_nac.layers import OUWrap

    torch.manual_seed(0)
    theirs = OUWrap(TorchNAC(64, 16, topk=8, input_dim=64), output_dim=1)

    def their_call(v: torch.Tensor) -> torch.Tensor:
        mean, log_sigma = theirs(v)[:2]
        return mean + log_sigma

    their_time = median_time(fwd_bwd(theirs, their_call), max(2, repeats // 5))
    out["torch_nac_ms"] = their_time * 1e3
    out["speedup_reference"] = their_time * 1e3 / float(out["ours_reference_ms"])
    out["speedup_corrected"] = their_time * 1e3 / float(out["ours_corrected_ms"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 3 if args.quick else 10
    inference = [inference_overhead(b, 20, repeats) for b in (1, 64)]
    controller = [controller_overhead(b, 20, 3 * repeats, source) for source in ("tokens", "tokens+conv") for b in (1, 11, 64)]
    layers = [layer_speed(64, 4, repeats), layer_speed(8, 256, max(repeats // 2, 2))]

    print(f"\n{'inference with uncertainty (S=20)':<34}{'determ.':>10}{'batched MC':>12}{'ratio':>8}{'published':>11}{'ratio':>8}")
    for r in inference:
        print(f"{'batch ' + str(r['batch']):<34}{r['deterministic_ms']:>8.2f}ms{r['batched_mc_ms']:>10.2f}ms"
              f"{r['batched_ratio']:>7.2f}×{r['published_mc_ms']:>9.1f}ms{r['published_ratio']:>7.1f}×")
    print(f"\n{'quality controller, S=20 + density':<34}{'determ.':>10}{'uncertain':>12}{'ratio':>8}{'target':>9}")
    for r in controller:
        print(f"{'batch ' + str(r['batch']) + ', ' + str(r['density_source']):<34}{r['deterministic_ms']:>8.2f}ms{r['uncertain_ms']:>10.2f}ms"
              f"{r['ratio']:>7.2f}×{'≤ 1.5×':>9}")
    print(f"\n{'NSAC layer fwd+bwd (d=64,H=16,K=8)':<34}{'ours ref':>11}{'ours corr':>11}{'torch-nac':>12}{'speed-up':>18}")
    for r in layers:
        theirs = r["torch_nac_ms"]
        if isinstance(theirs, str):
            tail = f"{theirs:>12}{'-':>18}"
        else:
            tail = f"{theirs:>10.1f}ms{r['speedup_reference']:>7.1f}× / {r['speedup_corrected']:.1f}×"
        print(f"{'B=' + str(r['batch']) + ', T=' + str(r['length']):<34}{r['ours_reference_ms']:>9.2f}ms"
              f"{r['ours_corrected_ms']:>9.2f}ms{tail}")
    out = ROOT / "bench" / "results" / ("nsac_speed-quick.json" if args.quick else "nsac_speed.json")
    atomic_write_json(out, {"inference": inference, "controller": controller, "layer": layers})
    print(f"\nsaved → {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
