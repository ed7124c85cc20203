"""Grad-CAM of a controller's actions and of its steering uncertainty, with a randomisation sanity check.

What is explained: the NEWEST frame of the T-frame input the controller sees; the older frames
enter through their tokens, held fixed (they are what the closed-loop agent caches), so a map
answers "which regions of the current frame push this output up or down".

Method (Selvaraju et al. 2017, via captum's ``LayerGradCam``; the published "Grad-CAM" was plain
input-gradient saliency with a label-dependent target, docs/driving.md#interpretability): the layer is the
encoder's last convolution (``FrameEncoder.last_conv``, a 7×8 map — the published CNN's 2×2 map
is too coarse and is refused with :class:`GradCamUnavailable`, as is the NVIDIA encoder's 1×18 strip
of Udacity frames); one scalar output per target:

* ``steer`` — the predictive mean steering. Attributions are kept SIGNED
  (``relu_attributions=False``): positive = evidence for steering right, negative = for left;
* ``gas``, ``brake`` — the predictive mean pedals (positive = evidence for more);
* ``steer_std`` — the predictive steering std √(aleatoric + epistemic): evidence for uncertainty.

Maps are upsampled bilinearly to the 84×96 preprocessed frame with
``LayerAttribution.interpolate``. pytorch-grad-cam is not used: it clips the sign and defaults to
argmax targets, both wrong for regression.

Stochastic heads (NSAC logit noise, MC-dropout masks, SDE paths, Lévy Poisson counts) draw
random numbers in every prediction. Every forward pass used for an attribution therefore runs
under one fixed torch seed (``SaliencyConfig.noise_seed``; common random numbers, the global RNG
is restored afterwards): the explained output is then a deterministic, differentiable function of
the frame, and all targets and all randomised models see the same draws. Lévy's epistemic part
comes from Poisson counts drawn without gradient, so its ``steer_std`` map explains the
aleatoric read-out only; heads with a constant std (``nac``) give an all-zero ``steer_std`` map.

Sanity check (Adebayo et al. 2018, cascading randomisation): the encoder's weight layers are
re-initialised one after another from the top (the token projection, then the convolutions
down to the first), and after each stage the maps are recomputed; the Spearman rank
correlation of each randomised map with the trained model's map should fall towards 0. If it
did not, the maps would show the image, not what the model learnt.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from captum.attr import LayerAttribution, LayerGradCam
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from torch import nn

from nsacdrive.common.figures import new_figure
from nsacdrive.controllers.controller import Controller
from nsacdrive.controllers.encoders import PerFrameEncoder
from nsacdrive.envs.observation import PREPROCESSED_FRAME_SHAPE, preprocess_observation
from nsacdrive.eval.plots import spearman

TARGETS = ("steer", "gas", "brake", "steer_std")
TARGET_MEANINGS = {
    "steer": "red: evidence for steering right, blue: for left",
    "gas": "red: evidence for more gas, blue: for less",
    "brake": "red: evidence for more brake, blue: for less",
    "steer_std": "red: evidence for more steering uncertainty, blue: for less",
}
MIN_MAP_SIDE = 6  # a Grad-CAM map coarser than 6×6 cannot localise anything on an 84×96 frame
MAP_SIZE = PREPROCESSED_FRAME_SHAPE[1:]


class GradCamUnavailable(ValueError):
    """The controller has no convolution map fine enough for Grad-CAM (the reason says why)."""


@dataclass(frozen=True)
class SaliencyConfig:
    """``samples``: draws per prediction (the run's ``predict_samples`` or the evaluation's);
    ``noise_seed``: the fixed seed of every attributed forward pass (see the module docstring)."""

    samples: int = 20
    noise_seed: int = 0


@dataclass
class SaliencyInputs:
    """What the controller sees at N chosen steps: the newest preprocessed frame [N, 3, 84, 96],
    the older frames [N, T−1, 3, 84, 96], the head's timestamps [N, T] (seconds, 0 = newest) and,
    for controllers with ``speed_input``, the measured speed at every frame [N, T]."""

    newest: torch.Tensor
    older: torch.Tensor
    timestamps: torch.Tensor
    speed: torch.Tensor | None = None

    @classmethod
    def from_sequences(cls, sequences: np.ndarray, timestamps: np.ndarray, speeds: np.ndarray | None = None) -> SaliencyInputs:
        """From raw uint8 frame sequences [N, T, 96, 96, 3] (oldest first), timestamps [T] and speeds [N, T]."""
        frames = torch.from_numpy(preprocess_observation(sequences))
        times = torch.from_numpy(np.asarray(timestamps, dtype=np.float32)).expand(len(frames), -1).contiguous()
        speed = None if speeds is None else torch.from_numpy(np.asarray(speeds, dtype=np.float32))
        return cls(frames[:, -1], frames[:, :-1], times, speed)


@dataclass
class GradCamMaps:
    """Signed maps [N, targets, 84, 96] (upsampled) and [N, targets, h, w] (on the conv map), and the
    explained outputs [N, targets]."""

    maps: np.ndarray
    coarse: np.ndarray
    outputs: np.ndarray
    targets: tuple[str, ...] = TARGETS


@dataclass
class SanityCheck:
    """Cascading randomisation: ``stages[i]`` names the layers re-initialised so far; ``maps``
    [stages, N, targets, 84, 96]; ``spearman`` / ``spearman_abs`` [stages, targets]: mean over
    frames of the rank correlation with the trained model's signed / absolute maps;
    ``self_spearman`` [targets]: the trained model's maps recomputed (1 when deterministic)."""

    stages: list[str]
    maps: np.ndarray
    spearman: np.ndarray
    spearman_abs: np.ndarray
    self_spearman: np.ndarray


def gradcam_layer(model: nn.Module) -> nn.Conv2d:
    """The encoder's last convolution, or :class:`GradCamUnavailable` saying why there is none."""
    if not isinstance(model, Controller):
        raise GradCamUnavailable(f"{type(model).__name__} is not one encoder + head (an ensemble has one conv map per "
                                 "member): Grad-CAM needs a single convolution layer to explain")
    if not isinstance(model.encoder, PerFrameEncoder):
        raise GradCamUnavailable(f"encoder {type(model.encoder).__name__} exposes no last convolution")
    layer = model.encoder.last_conv
    with torch.no_grad():
        shape = model.encoder.features[: model.encoder.LAST_CONV_INDEX + 1](torch.zeros(1, *model.encoder.FRAME_SHAPE)).shape
    if min(shape[2:]) < MIN_MAP_SIDE:
        raise GradCamUnavailable(f"the last convolution's map of {type(model.encoder).__name__} is {shape[2]}×{shape[3]}: "
                                 f"too coarse for Grad-CAM (needs ≥ {MIN_MAP_SIDE}×{MIN_MAP_SIDE}); no maps are shown "
                                 "rather than blurred blocks or strips")
    if model.encoder.FRAME_SHAPE != PREPROCESSED_FRAME_SHAPE:
        raise GradCamUnavailable(f"{type(model.encoder).__name__} reads {model.encoder.FRAME_SHAPE} frames; Grad-CAM maps "
                                 f"are drawn on CarRacing frames {PREPROCESSED_FRAME_SHAPE} only")
    return layer


def explained_outputs(model: Controller, inputs: SaliencyInputs, config: SaliencyConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    """newest frames [N, 3, 84, 96] → the target scalars [N, len(TARGETS)], differentiable, with the
    older frames' tokens fixed and every random draw made under ``config.noise_seed``."""
    speed = inputs.speed if model.speed_input else None
    with torch.no_grad():
        older_tokens = model.tokens(inputs.older, None if speed is None else speed[:, :-1])
    times = model.token_times(inputs.timestamps)

    def forward(newest: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.noise_seed)
            tokens = torch.cat([older_tokens, model.tokens(newest[:, None], None if speed is None else speed[:, -1:])], dim=1)
            prediction = model.head.predict(tokens, times, config.samples)
        steer_std = prediction.total[:, :1].clamp_min(1e-12).sqrt()
        return torch.cat([prediction.mean, steer_std], dim=1)

    return forward


def grad_cam(model: nn.Module, inputs: SaliencyInputs, config: SaliencyConfig = SaliencyConfig()) -> GradCamMaps:
    """Signed Grad-CAM maps of every target for every input step."""
    layer = gradcam_layer(model)
    assert isinstance(model, Controller)
    model.eval()
    forward = explained_outputs(model, inputs, config)
    cam = LayerGradCam(forward, layer)
    coarse, upsampled = [], []
    for k, target in enumerate(TARGETS):
        try:
            attribution = cam.attribute(inputs.newest, target=k, relu_attributions=False)
        except RuntimeError as exc:  # e.g. a head whose prediction carries no gradient at all
            raise GradCamUnavailable(f"Grad-CAM of {target}: {exc}") from None
        coarse.append(attribution.detach()[:, 0])
        upsampled.append(LayerAttribution.interpolate(attribution, MAP_SIZE, interpolate_mode="bilinear").detach()[:, 0])
    with torch.no_grad():
        outputs = forward(inputs.newest)
    return GradCamMaps(torch.stack(upsampled, 1).numpy(), torch.stack(coarse, 1).numpy(), outputs.numpy())


def randomisation_stages(model: Controller) -> list[str]:
    """Names of the encoder's weight layers from the top (token projection) down to the first conv."""
    names = [name for name, module in model.encoder.named_modules() if isinstance(module, (nn.Conv2d, nn.Linear))]
    return names[::-1]


def sanity_check(model: nn.Module, inputs: SaliencyInputs, reference: GradCamMaps,
                 config: SaliencyConfig = SaliencyConfig(), seed: int = 0) -> SanityCheck:
    """Cascading randomisation of the encoder (see the module docstring) on a copy of ``model``."""
    gradcam_layer(model)
    assert isinstance(model, Controller)
    again = grad_cam(copy.deepcopy(model), inputs, config)
    names = randomisation_stages(model)
    randomised = copy.deepcopy(model)
    modules = dict(randomised.encoder.named_modules())
    stages, maps = [], []
    for i, name in enumerate(names):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + i)
            modules[name].reset_parameters()
        stages.append(name if i == 0 else f"+ {name}")
        maps.append(grad_cam(randomised, inputs, config).maps)
    stacked = np.stack(maps)
    return SanityCheck(
        stages=stages, maps=stacked,
        spearman=np.array([[_mean_rank_correlation(reference.maps[:, k], m[:, k]) for k in range(len(TARGETS))] for m in stacked]),
        spearman_abs=np.array([[_mean_rank_correlation(np.abs(reference.maps[:, k]), np.abs(m[:, k])) for k in range(len(TARGETS))]
                               for m in stacked]),
        self_spearman=np.array([_mean_rank_correlation(reference.maps[:, k], again.maps[:, k]) for k in range(len(TARGETS))]),
    )


def _mean_rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over frames of the Spearman ρ of two maps [N, H, W]; NaN when every frame's is undefined
    (a constant map, e.g. the std of a head whose std does not depend on the input)."""
    values = [spearman(x.ravel(), y.ravel()) for x, y in zip(a, b)]
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


# --------------------------------------------------------------------------- figures


def display_frames(inputs: SaliencyInputs) -> np.ndarray:
    """The newest preprocessed frames as RGB images [N, 84, 96, 3] in [0, 1]: what the network saw."""
    return inputs.newest.permute(0, 2, 3, 1).numpy()


def overlay(ax: Axes, frame: np.ndarray, attribution: np.ndarray) -> AxesImage:
    """A signed map over a grey copy of the frame, diverging colours symmetric around 0."""
    ax.imshow(frame.mean(-1), cmap="gray", vmin=0.0, vmax=1.0)
    limit = float(np.abs(attribution).max()) or 1.0
    image = ax.imshow(attribution, cmap="RdBu_r", norm=Normalize(-limit, limit), alpha=0.6)
    ax.set_xticks([])
    ax.set_yticks([])
    return image


def gradcam_figure(frames: np.ndarray, maps: GradCamMaps, steps: list[int], title: str) -> Figure:
    """One row per step: the frame the network saw, then the signed map of every target over it."""
    columns = len(maps.targets) + 1
    fig = new_figure(figsize=(2.6 * columns + 1, 2.3 * len(frames) + 0.8))
    axes = np.atleast_2d(fig.subplots(len(frames), columns))
    for row, (frame, step) in enumerate(zip(frames, steps)):
        axes[row, 0].imshow(frame)
        axes[row, 0].set_xticks([])
        axes[row, 0].set_yticks([])
        axes[row, 0].set_title(f"step {step}", fontsize=9)
        for k, target in enumerate(maps.targets):
            ax = axes[row, k + 1]
            image = overlay(ax, frame, maps.maps[row, k])
            fig.colorbar(image, ax=ax, shrink=0.75)
            ax.set_title(f"{target} = {maps.outputs[row, k]:+.3f}", fontsize=9)
    fig.suptitle(f"{title}\nsigned Grad-CAM on the last conv map, bilinear upsampling; "
                 + "; ".join(f"{t}: {TARGET_MEANINGS[t]}" for t in ("steer", "steer_std")), fontsize=9)
    return fig


def sanity_figure(frames: np.ndarray, reference: GradCamMaps, check: SanityCheck, frame_index: int = 0) -> Figure:
    """One frame: per target the trained model's map, then the map after each randomisation stage,
    titled with the Spearman ρ against the trained map (mean over frames)."""
    columns = len(check.stages) + 1
    fig = new_figure(figsize=(2.6 * columns + 1, 2.3 * len(reference.targets) + 0.8))
    axes = np.atleast_2d(fig.subplots(len(reference.targets), columns))
    frame = frames[frame_index]
    for k, target in enumerate(reference.targets):
        overlay(axes[k, 0], frame, reference.maps[frame_index, k])
        axes[k, 0].set_title(f"{target}: trained", fontsize=9)
        for s, stage in enumerate(check.stages):
            overlay(axes[k, s + 1], frame, check.maps[s, frame_index, k])
            axes[k, s + 1].set_title(f"{stage}\nρ = {check.spearman[s, k]:.2f}", fontsize=8)
    fig.suptitle("Sanity check: encoder layers re-initialised from the top (cumulative); ρ = Spearman rank correlation "
                 "with the trained map, mean over frames", fontsize=9)
    return fig
