"""The trainer's resume state without pickle: tensors in a safetensors file, everything else in JSON.

A run folder may come from someone else, and its checksums sit in the same folder, so whoever
sends it sets both: reading it must never run code. ``torch.load`` unpickles, and even its
``weights_only`` mode is an unpickler with an allow-list (bypassed in torch releases this project
still admits). Here nothing is unpickled: :func:`encode_state` splits a nested state (optimiser,
scheduler and averaged-model state dicts, counters) into a JSON skeleton and named tensors, and
:func:`decode_state` rebuilds exactly the same structure, refusing anything but the few value
kinds a state holds.

The skeleton's encoding (every non-JSON value is an object with one key, so nothing is ambiguous):
``{"dict": [[key, value], ...]}`` (keys and order kept, int keys included), ``{"tuple": [...]}``,
``{"tensor": NAME}`` (a tensor of the safetensors file), ``{"float": "inf" | "-inf" | "nan"}``;
lists, strings, booleans, None, ints and finite floats are themselves.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as parse_safetensors
from safetensors.torch import save as save_safetensors

#: nesting allowed in a skeleton: far above what a state holds, far below Python's recursion limit
MAX_DEPTH = 64
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class StateFormatError(ValueError):
    """A state file pair that does not decode; the message says where in the structure and why."""


def encode_state(state: Any) -> tuple[bytes, bytes]:
    """The JSON skeleton and the safetensors file of ``state`` (nested dicts, lists, tuples, tensors,
    numbers, strings, booleans and None); tensors are saved as contiguous CPU copies."""
    tensors: dict[str, torch.Tensor] = {}

    def encode(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            name = f"t{len(tensors)}"
            # one copy, on the CPU, contiguous and never sharing storage (which safetensors refuses)
            tensors[name] = value.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
            return {"tensor": name}
        if isinstance(value, dict):
            bad = [key for key in value if not (key is None or isinstance(key, (bool, int, float, str)))]
            if bad:  # decode_state reads only these keys back: refuse now, not at the resume
                raise TypeError(f"trainer state: a dict key must be a string, number, boolean or None, got {bad[0]!r}")
            return {"dict": [[encode(key), encode(item)] for key, item in value.items()]}
        if isinstance(value, tuple):
            return {"tuple": [encode(item) for item in value]}
        if isinstance(value, list):
            return [encode(item) for item in value]
        if isinstance(value, float) and not math.isfinite(value):
            return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"trainer state: cannot save a {type(value).__name__} without pickle ({value!r})")

    skeleton = json.dumps(encode(state), allow_nan=False, separators=(",", ":")).encode()
    return skeleton, save_safetensors(tensors)


def decode_state(skeleton: bytes, tensor_file: bytes, where: str) -> Any:
    """The state :func:`encode_state` saved, from its two files' bytes; anything else raises
    :class:`StateFormatError` naming ``where`` (the files) and the part that is wrong. Every tensor
    of the safetensors file must be used exactly once."""
    try:
        tree = json.loads(skeleton)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise StateFormatError(f"{where}: the state's JSON does not parse ({exc})") from None
    try:
        tensors = parse_safetensors(tensor_file)
    except (SafetensorError, ValueError) as exc:
        raise StateFormatError(f"{where}: the state's tensors are not a readable safetensors file ({exc})") from None
    used: set[str] = set()

    def decode(node: Any, path: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise StateFormatError(f"{where}: {path}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, list):
            return [decode(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(node)]
        if not isinstance(node, dict):
            return node
        if len(node) != 1:
            raise StateFormatError(f"{where}: {path}: expected an object with one of the keys dict, tuple, tensor, float; got {sorted(node)}")
        (kind, body), = node.items()
        if kind == "dict" and isinstance(body, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in body):
            return {decode_key(key, path): decode(item, f"{path}[{key!r}]", depth + 1) for key, item in body}
        if kind == "tuple" and isinstance(body, list):
            return tuple(decode(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(body))
        if kind == "tensor" and isinstance(body, str):
            if body not in tensors or body in used:
                raise StateFormatError(f"{where}: {path}: tensor {body!r} is {'used twice' if body in used else 'not in the tensor file'}")
            used.add(body)
            return tensors[body]
        if kind == "float" and body in _NON_FINITE:
            return _NON_FINITE[body]
        raise StateFormatError(f"{where}: {path}: cannot decode {{{kind!r}: {str(body)[:60]}}}; expected "
                               "dict: [[key, value], ...], tuple: [...], tensor: NAME or float: inf/-inf/nan")

    def decode_key(key: Any, path: str) -> Any:
        if key is None or isinstance(key, (bool, int, float, str)):
            return key
        raise StateFormatError(f"{where}: {path}: a dict key must be a string, number, boolean or null, got {str(key)[:60]}")

    state = decode(tree, "state", 0)
    unused = sorted(set(tensors) - used)
    if unused:
        raise StateFormatError(f"{where}: the tensor file holds tensors the state never names: {unused[:5]}")
    return state

