"""Device names a config or option may give, checked without importing torch, so a config with a
misspelt device fails where it is read rather than at its first tensor."""

from __future__ import annotations

import re

#: The device types ``torch.device`` takes, as torch lists them (a test compares the two).
TORCH_DEVICE_TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia", "xla",
                      "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone")
_DEVICE_NAME = re.compile(f"(?:{'|'.join(TORCH_DEVICE_TYPES)})(?::(?:0|[1-9][0-9]*))?")
#: ``auto``: CUDA when present, else the CPU (``controllers.run.pick_device`` resolves it)
AUTO = "auto"


def is_torch_device(name: object) -> bool:
    """Whether ``torch.device(name)`` takes the name ``name`` (``cpu``, ``cuda``, ``cuda:1``): a type, then
    an optional index."""
    return isinstance(name, str) and _DEVICE_NAME.fullmatch(name) is not None


def check_device_name(name: object, where: str, allow_auto: bool = True) -> None:
    """Refuse a device name torch would not take (and ``auto`` unless ``allow_auto``).

    :raises ValueError: naming ``where`` (the config field or option), the name and what was expected
    """
    if (allow_auto and name == AUTO) or is_torch_device(name):
        return
    expected = "auto or a torch device" if allow_auto else "a torch device"
    raise ValueError(f"{where}: expected {expected} such as cpu, cuda or cuda:1, got {name!r}")
