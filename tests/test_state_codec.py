"""The trainer's resume state is saved and read without pickle: what is read is what was saved,
malformed files are named, and a pickle planted in a run folder is never unpickled."""

from __future__ import annotations

import hashlib
import json
import math
import pickle
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_run_faults import tiny_config, tiny_data  # noqa: F401  (fixture)

from nsacdrive.controllers import checkpoint
from nsacdrive.controllers.state_codec import StateFormatError, decode_state, encode_state
from nsacdrive.controllers.training import Trainer

scalars = st.none() | st.booleans() | st.integers(-2**62, 2**62) | st.floats(allow_nan=False) | st.text(max_size=8)
tensors = st.builds(lambda shape, seed: torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed)),
                    st.lists(st.integers(0, 3), max_size=3), st.integers(0, 1000))
keys = st.text(max_size=6) | st.integers(-100, 100)
states = st.recursive(scalars | tensors, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(keys, inner, max_size=4), max_leaves=20)


def same(a, b) -> bool:
    """Equal structure and values: tensors bit for bit, dict order and int keys kept, tuples stay tuples."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


@settings(max_examples=60, deadline=None)
@given(states)
def test_what_is_decoded_is_what_was_encoded(state):
    assert same(decode_state(*encode_state(state), "state"), state)


def test_non_finite_floats_and_int_keys_of_an_optimizer_state_survive():
    state = {"best": math.inf, "worse": -math.inf, "gap": math.nan, "state": {0: {"step": torch.tensor(3.0)}}, "betas": (0.9, 0.999)}
    skeleton, tensor_file = encode_state(state)
    json.loads(skeleton, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    assert same(decode_state(skeleton, tensor_file, "state"), state)


def test_a_real_optimizer_and_scheduler_state_round_trip():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    decoded = decode_state(*encode_state(state), "state")
    assert same(decoded, {"optimizer": optimizer.state_dict(), "scheduler": dict(scheduler.state_dict())})
    optimizer.load_state_dict(decoded["optimizer"])
    scheduler.load_state_dict(decoded["scheduler"])


def test_objects_that_only_pickle_could_save_are_refused():
    with pytest.raises(TypeError, match="cannot save a Linear without pickle"):
        encode_state({"module": torch.nn.Linear(1, 1)})


@pytest.mark.parametrize(("skeleton", "message"), [
    (b"{not json", "does not parse"),
    (b'{"pickle": "x"}', "cannot decode"),
    (b'{"dict": [[1, 2], 3]}', "cannot decode"),
    (b'{"tensor": "t9"}', "'t9' is not in the tensor file"),
    (b'[{"tensor": "t0"}, {"tensor": "t0"}]', "used twice"),
    (b'{"dict": [[[1], 2]]}', "a dict key must be"),
    (b'{"float": "huge"}', "cannot decode"),
    (b"[" * 100 + b"]" * 100, "nested deeper than"),
    (b"[" * 100_000 + b"]" * 100_000, "does not parse"),
])
def test_a_malformed_state_is_named_and_refused(skeleton, message):
    _, tensor_file = encode_state([torch.zeros(1)])
    with pytest.raises(StateFormatError, match=message) as caught:
        decode_state(skeleton, tensor_file, "RUN/state.json")
    assert str(caught.value).startswith("RUN/state.json")


def test_unused_tensors_and_unreadable_tensor_files_are_refused():
    skeleton, tensor_file = encode_state([torch.zeros(1), torch.ones(1)])
    with pytest.raises(StateFormatError, match="never names"):
        decode_state(b'[{"tensor": "t0"}]', tensor_file, "state")
    with pytest.raises(StateFormatError, match="not a readable safetensors file"):
        decode_state(skeleton, b"\x80\x04junk", "state")


class WritesMarker:
    """A pickle that, when unpickled, creates a marker file (what an attacker's payload would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def plant(folder: Path, name: str, payload: bytes) -> None:
    """Write ``payload`` as ``folder/name`` with a matching sha256 in the folder's checksums.json, as a sender could."""
    (folder / name).write_bytes(payload)
    recorded = json.loads((folder / checkpoint.CHECKSUMS_FILE).read_text())
    recorded[name] = hashlib.sha256(payload).hexdigest()
    (folder / checkpoint.CHECKSUMS_FILE).write_text(json.dumps(recorded))


def test_a_resume_folder_from_an_older_release_is_refused_without_unpickling_it(tiny_data, tmp_path):  # noqa: F811
    run, marker = tmp_path / "run", tmp_path / "marker"
    config = tiny_config(tiny_data, epochs=2)
    Trainer(config, run, progress=False).fit()
    folder = checkpoint.latest_checkpoint(run).folder
    for name in (checkpoint.STATE_SKELETON, checkpoint.STATE_TENSORS):
        (folder / name).unlink()
    plant(folder, checkpoint.PICKLED_STATE, pickle.dumps(WritesMarker(marker)))
    with pytest.raises(checkpoint.CheckpointError, match=r"state\.pt: a trainer state saved as a pickle .* never read"):
        Trainer(config, run, progress=False).fit(resume=True)
    assert not marker.exists()


def test_a_pickle_planted_beside_the_state_or_in_its_place_is_never_unpickled(tiny_data, tmp_path):  # noqa: F811
    run, marker = tmp_path / "run", tmp_path / "marker"
    config = tiny_config(tiny_data, epochs=1)
    Trainer(config, run, progress=False).fit()
    folder = checkpoint.latest_checkpoint(run).folder
    payload = pickle.dumps(WritesMarker(marker))
    plant(folder, checkpoint.PICKLED_STATE, payload)
    Trainer(config, run, progress=False).fit(resume=True)  # beside the state: ignored
    for name in (checkpoint.LAST_WEIGHTS, checkpoint.STATE_TENSORS, checkpoint.STATE_SKELETON):  # in its place: refused
        original = (folder / name).read_bytes()
        plant(folder, name, payload)
        with pytest.raises(ValueError, match=rf"{name}.*(not a readable safetensors file|does not parse)"):
            Trainer(config, run, progress=False).fit(resume=True)
        plant(folder, name, original)
    assert not marker.exists()
