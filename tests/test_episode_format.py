"""The lossless episode format (data_collection/episode.py) on synthetic episodes.

Every corruption case is built so that the check it targets is actually reached: checksum
failures by editing the .npz behind the sidecar's back, later checks (members, shapes, dtypes,
n_steps, NaN) by writing a sidecar whose sha256 / file_size match the bad .npz.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import numpy as np
import pytest
from data_fixtures import encode_raw, synthetic_arrays, synthetic_metadata, write_raw_episode, write_synthetic

from nsacdrive.data_collection.episode import (
    EPISODE_ARRAYS,
    FORMAT_VERSION,
    SIDECAR_FIELDS,
    EpisodeFileError,
    EpisodePaths,
    check_array,
    encode_episode,
    load_episode_arrays,
    read_sidecar,
    write_episode,
)

N = 12


# --------------------------------------------------------------------------- writing and reading


def test_round_trip_is_lossless(tmp_path):
    sidecar, arrays = write_synthetic(tmp_path, "ep", N, track_seed=5, colour_preset="shift-2")
    loaded_sidecar, loaded = load_episode_arrays(tmp_path / "ep.json")
    assert loaded_sidecar == sidecar
    assert set(loaded) == set(EPISODE_ARRAYS)
    for name, array in arrays.items():
        assert loaded[name].dtype == EPISODE_ARRAYS[name][0], name
        np.testing.assert_array_equal(loaded[name], array, err_msg=name)


def test_sidecar_contents(tmp_path):
    arrays = synthetic_arrays(N)
    metadata = synthetic_metadata(arrays, track_seed=9, colour_preset="shift-1")
    sidecar = write_episode(tmp_path, "abc", arrays, metadata)
    payload = (tmp_path / "abc.npz").read_bytes()
    on_disk = json.loads((tmp_path / "abc.json").read_text())
    assert on_disk == sidecar
    assert set(SIDECAR_FIELDS) <= set(sidecar)
    assert sidecar["format_version"] == FORMAT_VERSION == 1
    assert sidecar["episode_id"] == "abc"
    assert sidecar["file"] == "abc.npz"
    assert sidecar["n_steps"] == N
    assert sidecar["sha256"] == hashlib.sha256(payload).hexdigest()
    assert sidecar["file_size"] == len(payload)
    assert sidecar["track_seed"] == 9
    assert sidecar["colour_preset"] == "shift-1"
    assert sidecar["colour_scheme"]["name"] == "shift-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abc.json", "abc.npz"]  # no temp files left


def test_metadata_cannot_override_format_fields(tmp_path):
    arrays = synthetic_arrays(N)
    metadata = {**synthetic_metadata(arrays, 0), "n_steps": 999, "sha256": "forged", "file": "other.npz",
                "episode_id": "other", "format_version": 7, "file_size": 1}
    sidecar = write_episode(tmp_path, "real", arrays, metadata)
    assert sidecar["n_steps"] == N
    assert sidecar["file"] == "real.npz"
    assert sidecar["episode_id"] == "real"
    assert sidecar["format_version"] == FORMAT_VERSION
    assert sidecar["sha256"] == hashlib.sha256((tmp_path / "real.npz").read_bytes()).hexdigest()
    load_episode_arrays(tmp_path / "real.json")  # and it loads


def test_npz_is_a_standard_numpy_archive(tmp_path):
    _, arrays = write_synthetic(tmp_path, "ep", N, track_seed=1)
    with np.load(tmp_path / "ep.npz", allow_pickle=False) as data:
        assert sorted(data.files) == sorted(EPISODE_ARRAYS)
        for name in EPISODE_ARRAYS:
            np.testing.assert_array_equal(data[name], arrays[name])


def test_encode_episode_is_deterministic_with_fixed_member_order_and_dates():
    arrays = synthetic_arrays(N, seed=3)
    first = encode_episode(arrays)
    copy = {name: array.copy() for name, array in reversed(list(arrays.items()))}  # other dict order, other buffers
    assert encode_episode(copy) == first
    archive = zipfile.ZipFile(io.BytesIO(first))
    assert [info.filename for info in archive.infolist()] == [f"{name}.npy" for name in EPISODE_ARRAYS]
    assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_DEFLATED}
    # a different episode gives different bytes
    assert encode_episode(synthetic_arrays(N, seed=4)) != first


def test_encode_episode_handles_non_contiguous_arrays():
    arrays = synthetic_arrays(N)
    strided = dict(arrays)
    wide = np.zeros((N, 6), dtype=np.float32)
    wide[:, ::2] = arrays["actions"]
    strided["actions"] = wide[:, ::2]
    assert not strided["actions"].flags.c_contiguous
    assert encode_episode(strided) == encode_episode(arrays)


def test_write_episode_twice_gives_identical_bytes(tmp_path):
    arrays = synthetic_arrays(N, seed=2)
    metadata = synthetic_metadata(arrays, 2)
    write_episode(tmp_path / "a", "ep", arrays, metadata)
    write_episode(tmp_path / "b", "ep", arrays, metadata)
    assert (tmp_path / "a" / "ep.npz").read_bytes() == (tmp_path / "b" / "ep.npz").read_bytes()
    assert (tmp_path / "a" / "ep.json").read_bytes() == (tmp_path / "b" / "ep.json").read_bytes()


def test_zero_step_episode_round_trips(tmp_path):
    write_synthetic(tmp_path, "empty", 0, track_seed=0)
    sidecar, arrays = load_episode_arrays(tmp_path / "empty.json")
    assert sidecar["n_steps"] == 0
    assert arrays["observations"].shape == (1, 96, 96, 3)
    assert arrays["actions"].shape == (0, 3)


def test_load_without_observations_skips_pixels_but_validates_everything_else(tmp_path):
    _, arrays = write_synthetic(tmp_path, "ep", N, track_seed=1)
    sidecar, loaded = load_episode_arrays(tmp_path / "ep.json", include_observations=False)
    assert "observations" not in loaded
    np.testing.assert_array_equal(loaded["expert_actions"], arrays["expert_actions"])
    assert sidecar["n_steps"] == N


def test_episode_paths():
    from pathlib import Path

    paths = EpisodePaths.for_id(Path("/data"), "expert_default_seed000001")
    assert paths.data == Path("/data/expert_default_seed000001.npz")
    assert paths.sidecar == Path("/data/expert_default_seed000001.json")


# --------------------------------------------------------------------------- write-time validation


@pytest.mark.parametrize(
    ("name", "bad", "fragment"),
    [
        ("actions", lambda a: a.astype(np.float64), "array 'actions' has dtype float64, expected float32"),
        ("observations", lambda a: a.astype(np.int16), "array 'observations' has dtype int16, expected uint8"),
        ("terminations", lambda a: a.astype(np.uint8), "array 'terminations' has dtype uint8, expected bool"),
        ("observations", lambda a: a[:-1], "array 'observations' has shape (12, 96, 96, 3)"),
        ("observations", lambda a: a[:, :64, :64], "array 'observations' has shape (13, 64, 64, 3)"),
        ("actions", lambda a: a[:, :2], "array 'actions' has shape (12, 2)"),
        ("rewards", lambda a: a[:, None], "array 'rewards' has shape (12, 1)"),
        ("pose", lambda a: a[:-1], "array 'pose' has shape (12, 3)"),
        ("state", lambda a: a[:, 0], "array 'state' has shape (13,)"),
        ("expert_actions", lambda a: a[:-2], "array 'expert_actions' has shape (10, 3)"),
    ],
)
def test_write_episode_rejects_bad_arrays_and_writes_nothing(tmp_path, name, bad, fragment):
    arrays = synthetic_arrays(N)
    arrays[name] = bad(arrays[name])
    with pytest.raises(EpisodeFileError) as excinfo:
        write_episode(tmp_path, "bad_ep", arrays, synthetic_metadata(synthetic_arrays(N), 0))
    assert str(tmp_path / "bad_ep.npz") in str(excinfo.value)
    assert fragment in str(excinfo.value)
    assert list(tmp_path.iterdir()) == []


def test_write_episode_rejects_missing_arrays(tmp_path):
    arrays = synthetic_arrays(N)
    del arrays["progress"], arrays["state"]
    with pytest.raises(EpisodeFileError, match=r"bad_ep\.npz: episode lacks arrays \['progress', 'state'\]"):
        write_episode(tmp_path, "bad_ep", arrays, {})
    assert list(tmp_path.iterdir()) == []


def test_state_width_is_free_but_must_be_2d():
    check_array("state", np.dtype(np.float32), (5, 7), 4, "x")
    check_array("state", np.dtype(np.float32), (5, 99), 4, "x")
    with pytest.raises(EpisodeFileError):
        check_array("state", np.dtype(np.float32), (4, 7), 4, "x")


def test_write_episode_accepts_nan_actions_but_loader_rejects_them(tmp_path):
    arrays = synthetic_arrays(N)
    arrays["actions"][7, 1] = np.nan
    write_episode(tmp_path, "nan_ep", arrays, synthetic_metadata(arrays, 0))  # not rejected at write time
    assert (tmp_path / "nan_ep.npz").exists()
    with pytest.raises(EpisodeFileError) as excinfo:
        load_episode_arrays(tmp_path / "nan_ep.json")
    message = str(excinfo.value)
    assert "nan_ep.npz" in message and "NaN" in message
    assert "'actions'" in message and "step 7" in message


def test_loader_rejects_infinite_expert_labels(tmp_path):
    arrays = synthetic_arrays(N)
    arrays["expert_actions"][3, 0] = -np.inf
    write_episode(tmp_path, "inf_ep", arrays, synthetic_metadata(arrays, 0))
    with pytest.raises(EpisodeFileError, match=r"inf_ep\.npz: array 'expert_actions' holds NaN/inf \(first at step 3\)"):
        load_episode_arrays(tmp_path / "inf_ep.json", include_observations=False)


def test_side_camera_labels_round_trip_and_are_validated_like_the_labels(tmp_path):
    arrays = synthetic_arrays(N)
    arrays["left_expert_actions"] = arrays["expert_actions"] + np.float32(0.1)
    write_episode(tmp_path, "side", arrays, synthetic_metadata(arrays, 0))
    _, loaded = load_episode_arrays(tmp_path / "side.json", include_observations=False)
    np.testing.assert_array_equal(loaded["left_expert_actions"], arrays["left_expert_actions"])
    assert "right_expert_actions" not in loaded
    short = {**arrays, "right_expert_actions": arrays["expert_actions"][:-1]}
    with pytest.raises(EpisodeFileError, match=r"array 'right_expert_actions' has shape"):
        write_episode(tmp_path, "short", short, synthetic_metadata(arrays, 0))
    arrays["left_expert_actions"][5, 0] = np.nan
    write_episode(tmp_path, "nan_side", arrays, synthetic_metadata(arrays, 0))
    with pytest.raises(EpisodeFileError, match=r"nan_side\.npz: array 'left_expert_actions' holds NaN/inf \(first at step 5\)"):
        load_episode_arrays(tmp_path / "nan_side.json", include_observations=False)


# --------------------------------------------------------------------------- corrupt files


@pytest.fixture
def good_episode(tmp_path):
    sidecar, arrays = write_synthetic(tmp_path, "victim", N, track_seed=4)
    return tmp_path / "victim.json", tmp_path / "victim.npz"


def _load_error(sidecar_path, include_observations=True) -> str:
    with pytest.raises(EpisodeFileError) as excinfo:
        load_episode_arrays(sidecar_path, include_observations=include_observations)
    return str(excinfo.value)


@pytest.mark.parametrize("include_observations", [True, False])
def test_truncated_npz(good_episode, include_observations):
    sidecar_path, data_path = good_episode
    size = data_path.stat().st_size
    data_path.write_bytes(data_path.read_bytes()[: size // 2])
    message = _load_error(sidecar_path, include_observations)
    assert str(data_path) in message
    assert f"file has {size // 2} bytes, sidecar says {size}" in message


@pytest.mark.parametrize("include_observations", [True, False])
def test_flipped_bytes_fail_the_checksum(good_episode, include_observations):
    sidecar_path, data_path = good_episode
    payload = bytearray(data_path.read_bytes())
    payload[len(payload) // 3] ^= 0x01  # same size, one bit different
    data_path.write_bytes(bytes(payload))
    message = _load_error(sidecar_path, include_observations)
    assert str(data_path) in message
    assert "sha256 differs" in message


def test_missing_npz(good_episode):
    sidecar_path, data_path = good_episode
    data_path.unlink()
    message = _load_error(sidecar_path)
    assert str(data_path) in message and "episode file is missing" in message


def test_missing_sidecar(good_episode):
    sidecar_path, _ = good_episode
    sidecar_path.unlink()
    message = _load_error(sidecar_path)
    assert str(sidecar_path) in message and "sidecar file is missing" in message


@pytest.mark.parametrize("text", ["{not json", "", "\xff\xfe garbage"])
def test_sidecar_invalid_json(good_episode, text):
    sidecar_path, _ = good_episode
    sidecar_path.write_bytes(text.encode("latin-1"))
    message = _load_error(sidecar_path)
    assert str(sidecar_path) in message and "not valid JSON" in message


def test_sidecar_not_an_object(good_episode):
    sidecar_path, _ = good_episode
    sidecar_path.write_text("[1, 2, 3]")
    message = _load_error(sidecar_path)
    assert str(sidecar_path) in message and "must be a JSON object" in message


@pytest.mark.parametrize("missing", [["sha256"], ["n_steps", "track_seed"], ["file"], ["colour_scheme"]])
def test_sidecar_missing_fields(good_episode, missing):
    sidecar_path, _ = good_episode
    sidecar = json.loads(sidecar_path.read_text())
    for field in missing:
        del sidecar[field]
    sidecar_path.write_text(json.dumps(sidecar))
    message = _load_error(sidecar_path)
    assert str(sidecar_path) in message
    assert f"sidecar lacks fields {[f for f in SIDECAR_FIELDS if f in missing]}" in message


def test_sidecar_wrong_format_version(good_episode):
    sidecar_path, _ = good_episode
    sidecar = json.loads(sidecar_path.read_text())
    sidecar["format_version"] = 2
    sidecar_path.write_text(json.dumps(sidecar))
    message = _load_error(sidecar_path)
    assert str(sidecar_path) in message and "format_version 2, this reader expects 1" in message


def test_read_sidecar_returns_the_parsed_object(good_episode):
    sidecar_path, _ = good_episode
    assert read_sidecar(sidecar_path) == json.loads(sidecar_path.read_text())


@pytest.mark.parametrize("include_observations", [True, False])
def test_n_steps_mismatch(good_episode, include_observations):
    # the sidecar's sha256/size pin the .npz, not n_steps: editing n_steps reaches the length check
    sidecar_path, data_path = good_episode
    sidecar = json.loads(sidecar_path.read_text())
    sidecar["n_steps"] = N + 3
    sidecar_path.write_text(json.dumps(sidecar))
    message = _load_error(sidecar_path, include_observations)
    assert str(data_path) in message
    assert f"{N} actions but the sidecar says n_steps={N + 3}" in message


@pytest.mark.parametrize("include_observations", [True, False])
def test_wrong_frame_shape_with_matching_checksum(tmp_path, include_observations):
    arrays = synthetic_arrays(N)
    arrays["observations"] = arrays["observations"][:, :64, :80]
    sidecar_path = write_raw_episode(tmp_path, "small_frames", encode_raw(arrays), N)
    message = _load_error(sidecar_path, include_observations)
    assert "small_frames.npz" in message
    assert "array 'observations' has shape (13, 64, 80, 3)" in message


@pytest.mark.parametrize("include_observations", [True, False])
def test_wrong_frame_count_with_matching_checksum(tmp_path, include_observations):
    arrays = synthetic_arrays(N)
    arrays["observations"] = arrays["observations"][:N]  # T frames instead of T+1
    sidecar_path = write_raw_episode(tmp_path, "short_obs", encode_raw(arrays), N)
    message = _load_error(sidecar_path, include_observations)
    assert "short_obs.npz" in message and "array 'observations' has shape (12, 96, 96, 3)" in message


def test_wrong_dtype_with_matching_checksum(tmp_path):
    arrays = synthetic_arrays(N)
    arrays["rewards"] = arrays["rewards"].astype(np.float64)
    sidecar_path = write_raw_episode(tmp_path, "f64", encode_raw(arrays), N)
    message = _load_error(sidecar_path, include_observations=False)
    assert "f64.npz" in message and "array 'rewards' has dtype float64, expected float32" in message


def test_wrong_small_array_shape_with_matching_checksum(tmp_path):
    arrays = synthetic_arrays(N)
    arrays["lateral_error"] = arrays["lateral_error"][:N]
    sidecar_path = write_raw_episode(tmp_path, "lat", encode_raw(arrays), N)
    message = _load_error(sidecar_path)
    assert "lat.npz" in message and "array 'lateral_error' has shape (12,)" in message


def test_nan_with_matching_checksum(tmp_path):
    arrays = synthetic_arrays(N)
    arrays["expert_actions"][0, 2] = np.nan
    sidecar_path = write_raw_episode(tmp_path, "nan_label", encode_raw(arrays), N)
    message = _load_error(sidecar_path)
    assert "nan_label.npz" in message and "NaN" in message and "step 0" in message


def _zip_without(arrays, missing: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, array in arrays.items():
            if name != missing:
                with archive.open(f"{name}.npy", "w") as member:
                    np.lib.format.write_array(member, array)
    return buffer.getvalue()


@pytest.mark.parametrize("missing", ["state", "observations"])
@pytest.mark.parametrize("include_observations", [True, False])
def test_missing_member_with_matching_checksum(tmp_path, missing, include_observations):
    sidecar_path = write_raw_episode(tmp_path, "holey", _zip_without(synthetic_arrays(N), missing), N)
    message = _load_error(sidecar_path, include_observations)
    assert "holey.npz" in message and f"array '{missing}' is missing" in message


def test_not_a_zip_with_matching_checksum(tmp_path):
    sidecar_path = write_raw_episode(tmp_path, "garbage", b"this is not a zip archive" * 10, N)
    message = _load_error(sidecar_path)
    assert "garbage.npz" in message and "not a readable npz archive" in message


def test_undecodable_member_with_matching_checksum(tmp_path):
    buffer = io.BytesIO()
    arrays = synthetic_arrays(N)
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w") as member:
                if name == "speed":
                    member.write(b"\x93NUMPY garbage header")
                else:
                    np.lib.format.write_array(member, array)
    sidecar_path = write_raw_episode(tmp_path, "undecodable", buffer.getvalue(), N)
    message = _load_error(sidecar_path)
    assert "undecodable.npz" in message and "array 'speed' cannot be decoded" in message


def test_pickled_object_member_is_refused(tmp_path):
    arrays = synthetic_arrays(N)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w") as member:
                value = np.array([{"evil": 1}] * N, dtype=object) if name == "rewards" else array
                np.lib.format.write_array(member, value, allow_pickle=True)
    sidecar_path = write_raw_episode(tmp_path, "pickled", buffer.getvalue(), N)
    message = _load_error(sidecar_path)
    assert "pickled.npz" in message and "array 'rewards' cannot be decoded" in message


def _corrupt_deflate_stream(payload: bytes, member: str) -> bytes:
    """Flip bytes inside one member's compressed data (the zip container stays readable)."""
    archive = zipfile.ZipFile(io.BytesIO(payload))
    info = archive.getinfo(member)
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data = bytearray(payload)
    for k in range(20, min(60, info.compress_size)):
        data[start + k] ^= 0xFF
    return bytes(data)


def test_corrupt_deflate_stream_with_matching_checksum_is_an_episode_file_error(tmp_path):
    arrays = synthetic_arrays(N)
    payload = _corrupt_deflate_stream(encode_episode(arrays), "actions.npy")
    sidecar_path = write_raw_episode(tmp_path, "deflate", payload, N)
    try:
        load_episode_arrays(sidecar_path)
    except EpisodeFileError as exc:
        assert "deflate.npz" in str(exc)
    else:  # pragma: no cover - a silent load would be a different bug
        pytest.fail("corrupt member loaded without error")


@pytest.mark.parametrize(("field", "value"), [("n_steps", "abc"), ("n_steps", None), ("file", None)])
def test_sidecar_field_of_wrong_type_is_an_episode_file_error(good_episode, field, value):
    sidecar_path, _ = good_episode
    sidecar = json.loads(sidecar_path.read_text())
    sidecar[field] = value
    sidecar_path.write_text(json.dumps(sidecar))
    with pytest.raises(EpisodeFileError) as excinfo:
        load_episode_arrays(sidecar_path)
    assert "victim.json" in str(excinfo.value) or "victim.npz" in str(excinfo.value)
