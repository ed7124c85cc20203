"""Training precision: float32, or the encoders' convolutions in bfloat16 where that is faster.

Three quarters of a CarRacing training step are the encoder's convolutions (docs/engineering-notes.md, *Benchmarks*).
With ``TrainConfig.precision = "bfloat16"`` they run under :func:`torch.autocast`: inputs and
weights rounded to bfloat16, products accumulated in float32, the weights, their gradients, the
optimiser, the attention head and the loss in float32, and the tokens handed on as float32.
That pays where bfloat16 has hardware behind it — GPUs that support it, CPUs with AMX tiles — and
costs elsewhere (emulated), so it is a training setting, never a model property: a trained run
drives and is evaluated in float32 like any other.
"""

from __future__ import annotations

import torch
from torch import nn

from nsacdrive.controllers.encoders import PerFrameEncoder
from nsacdrive.controllers.model_names import PRECISION_NAMES

#: ``TrainConfig.precision`` → the dtype the encoders compute in (None: float32, no autocast)
PRECISIONS: dict[str, torch.dtype | None] = dict(zip(PRECISION_NAMES, (None, torch.bfloat16), strict=True))


def set_encoder_precision(model: nn.Module, precision: str) -> None:
    """Make every per-frame encoder in ``model`` compute in ``precision`` (a key of :data:`PRECISIONS`)."""
    for module in model.modules():
        if isinstance(module, PerFrameEncoder):
            module.autocast_dtype = PRECISIONS[precision]


def cpu_has_amx_tiles() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later): bfloat16 matrix units."""
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def slow_precision(precision: str, device: torch.device) -> str | None:
    """Why ``precision`` would train slower than float32 on ``device``, or None. bfloat16
    convolutions are fast on GPUs that support bfloat16 and on CPUs with AMX tiles; elsewhere they
    are emulated (1.2–2.5× slower than float32 on an AVX-512 CPU without AMX; docs/guide/train.md)."""
    if precision == "float32":
        return None
    if device.type == "cuda":
        return None if torch.cuda.is_bf16_supported() else f"this GPU has no native {precision}"
    if device.type == "cpu" and not cpu_has_amx_tiles():
        return f"this CPU has no AMX tiles, so its {precision} convolutions are emulated"
    return None
