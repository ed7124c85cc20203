"""``nsacdrive udacity import``: Udacity recordings (header or not; relative, absolute, Windows and
foreign paths; missing images) → episodes in the extended episode format, and the ``udacity:DIR``
import cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import encode_raw, normalize, synthetic_arrays, write_raw_episode, write_synthetic
from typer.testing import CliRunner
from udacity_fixtures import PATH_STYLES, jpeg_header, write_recording

from nsacdrive.cli import app
from nsacdrive.data_collection.dataset import dataset_roots
from nsacdrive.data_collection.episode import EpisodeFileError, load_episode_arrays, read_sidecar, write_episode
from nsacdrive.data_collection.errors import DatasetError
from nsacdrive.data_collection.manifest import sidecar_paths
from nsacdrive.data_collection.summary import summarize
from nsacdrive.data_collection.udacity_import import (
    CACHE_NAME,
    MAX_FIELD_CHARS,
    MAX_LINE_BYTES,
    MAX_LISTED,
    ImportConfig,
    UdacityImportError,
    image_candidates,
    import_recording,
    read_driving_log,
    udacity_dataset,
)
from nsacdrive.data_collection.udacity_layout import declared_frame_size
from nsacdrive.envs.udacity_observation import encode_jpeg


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def episodes(folder):
    """(sidecar, arrays) of every episode in ``folder``, in id order."""
    return [load_episode_arrays(path) for path in sidecar_paths(folder)]


# --------------------------------------------------------------------------- the log


@pytest.mark.parametrize("header", [False, True])
def test_header_is_detected_and_rows_parsed(tmp_path, header):
    rec = write_recording(tmp_path / "rec", rows=5, header=header)
    log, has_header = read_driving_log(rec.folder)
    assert has_header is header and len(log) == 5
    rows = list(log)
    assert [row.line for row in rows] == [rec.line(i) for i in range(5)]
    np.testing.assert_allclose([row.action for row in rows], rec.actions, atol=1e-6)
    np.testing.assert_allclose([row.speed for row in rows], rec.speed, atol=1e-4)
    assert rows[0].images["left"] == "IMG/left_0000.jpg"  # the leading space is stripped


def test_malformed_lines_are_all_named(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=4)
    lines = (rec.folder / "driving_log.csv").read_text().splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0]  # 6 columns
    lines[3] = lines[3].replace(lines[3].split(",")[3], "left-ish")
    (rec.folder / "driving_log.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(UdacityImportError) as error:
        read_driving_log(rec.folder)
    message = str(error.value)
    assert "driving_log.csv: 2 malformed line(s)" in message
    assert "line 2: 6 columns, expected 7" in message and "line 4: steering 'left-ish' is not a finite number" in message


def _write_log(folder: Path, lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "driving_log.csv").write_text("\n".join(lines) + "\n")


def test_the_malformed_lines_listing_is_capped(tmp_path):
    _write_log(tmp_path, [f"junk{i},not,a,row" for i in range(200)])
    with pytest.raises(UdacityImportError) as error:
        read_driving_log(tmp_path)
    lines = str(error.value).splitlines()
    assert lines[0] == f"{tmp_path / 'driving_log.csv'}: 200 malformed line(s):"
    assert lines[1] == "  line 1: 4 columns, expected 7 (center, left, right, steering, throttle, brake, speed)"
    assert lines[MAX_LISTED].startswith(f"  line {MAX_LISTED}: ")
    assert lines[MAX_LISTED + 1:] == [f"  … and {200 - MAX_LISTED} more malformed lines"]


def test_overlong_fields_overlong_lines_and_non_utf8_are_malformed_lines(tmp_path):
    good = "IMG/c.jpg,,,0.1,0.5,0,10"
    lines = [good, f"IMG/{'c' * MAX_FIELD_CHARS}.jpg,,,0,0,0,0", "x" * (MAX_LINE_BYTES + 10), good]
    _write_log(tmp_path, lines)
    with open(tmp_path / "driving_log.csv", "ab") as handle:
        handle.write(b"IMG/\xff\xfe.jpg,,,0,0,0,0\n")
    with pytest.raises(UdacityImportError) as error:
        read_driving_log(tmp_path)
    message = str(error.value)
    assert "3 malformed line(s)" in message
    assert f"line 2: field 1 has {MAX_FIELD_CHARS + 8} characters, expected at most {MAX_FIELD_CHARS}" in message
    assert f"line 3: longer than {MAX_LINE_BYTES} bytes (expected 7 short fields)" in message
    assert "line 5: not UTF-8 text (byte 5)" in message and "line 4" not in message


def test_reading_the_log_streams_its_rows(tmp_path):
    rows = 20000  # 2.5 MB of log: held as rows it would take tens of MB
    _write_log(tmp_path, [f"IMG/center_{i:08d}_{'x' * 80}.jpg,IMG/left_{i:08d}.jpg,,0.1,0.5,0,{i % 30}" for i in range(rows)])
    tracemalloc.start()
    try:
        log, header = read_driving_log(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (len(log), header, log.cameras) == (rows, False, ("center", "left")) and peak < 1_000_000
    stream = iter(log)
    assert next(stream).line == 1 and next(stream).speed == 1.0  # parsed again, one row at a time
    (tmp_path / "driving_log.csv").write_text("IMG/a.jpg,,,0,0,0,0\nchanged\n")
    with pytest.raises(UdacityImportError, match="line 2: 1 columns.*the log changed during the import"):
        list(log)


def test_steering_outside_the_unit_range_is_an_error_naming_every_row(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=5)
    lines = [line.split(",") for line in (rec.folder / "driving_log.csv").read_text().splitlines()]
    for index, steering in ((1, "1.5"), (3, "-25")):  # degrees instead of the normalised angle, say
        lines[index][3] = steering
    lines[4][3] = "-1"  # the ends of the range are fine
    (rec.folder / "driving_log.csv").write_text("\n".join(",".join(cells) for cells in lines) + "\n")
    with pytest.raises(UdacityImportError) as error:
        import_recording(rec.folder, tmp_path / "out")
    message = str(error.value)
    assert f"{rec.folder / 'driving_log.csv'}: 2 malformed line(s)" in message
    assert "line 2: steering 1.5 is outside [-1, 1]" in message and "line 4: steering -25 is outside [-1, 1]" in message
    assert "line 5" not in message
    assert not (tmp_path / "out").exists()


def test_missing_log_and_unknown_header_are_clear(tmp_path):
    with pytest.raises(UdacityImportError, match="driving_log.csv: driving log not found"):
        read_driving_log(tmp_path)
    (tmp_path / "driving_log.csv").write_text("a,b,c,d,e,f,g\n")
    with pytest.raises(UdacityImportError, match="line 1 is neither a data row nor the header"):
        read_driving_log(tmp_path)


def test_image_candidates_handle_windows_and_foreign_paths(tmp_path):
    assert image_candidates(tmp_path, "C:\\Users\\x\\IMG\\center_1.jpg")[-1] == tmp_path / "IMG" / "center_1.jpg"
    assert image_candidates(tmp_path, " IMG/left_1.jpg") == [tmp_path / "IMG" / "left_1.jpg"]
    assert image_candidates(tmp_path, "/elsewhere/IMG/c.jpg") == [Path("/elsewhere/IMG/c.jpg"), tmp_path / "IMG" / "c.jpg"]


def test_frame_headers_declare_their_size_without_decoding():
    assert declared_frame_size(encode_jpeg(np.zeros((160, 320, 3), np.uint8))) == (320, 160)
    import cv2

    assert declared_frame_size(cv2.imencode(".png", np.zeros((66, 200, 3), np.uint8))[1].tobytes()) == (200, 66)
    assert declared_frame_size(jpeg_header(12000, 12000)) == (12000, 12000)
    for junk in (b"", b"GIF89a", b"\xff\xd8\xff\xe0" + bytes(32), jpeg_header(320, 160)[:8]):
        assert declared_frame_size(junk) is None


# --------------------------------------------------------------------------- importing


@pytest.mark.parametrize("paths", PATH_STYLES)
@pytest.mark.parametrize("header", [False, True])
def test_every_path_style_imports_the_exact_frames(tmp_path, paths, header):
    rec = write_recording(tmp_path / "rec", rows=6, header=header, paths=paths)
    result = import_recording(rec.folder, tmp_path / "out")
    assert (result.episodes, result.steps, result.rows, result.header) == (1, 5, 6, header)
    assert result.cameras == ("center", "left", "right")
    [(sidecar, arrays)] = episodes(tmp_path / "out")
    for row in range(6):
        np.testing.assert_array_equal(arrays["observations"][row], rec.rgb("center", row))
        np.testing.assert_array_equal(arrays["left_observations"][row], rec.rgb("left", row))
        np.testing.assert_array_equal(arrays["right_observations"][row], rec.rgb("right", row))
    np.testing.assert_allclose(arrays["actions"], rec.actions[:5], atol=1e-6)
    np.testing.assert_array_equal(arrays["expert_actions"], arrays["actions"])
    np.testing.assert_allclose(arrays["speed"], rec.speed, atol=1e-4)
    assert sidecar["recording"]["header"] is header and sidecar["recording"]["lines"] == [rec.line(0), rec.line(5)]


def test_imported_episodes_carry_the_documented_placeholders(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=4)
    import_recording(rec.folder, tmp_path / "out")
    [(sidecar, arrays)] = episodes(tmp_path / "out")
    assert sidecar["frame_kind"] == "udacity" and sidecar["source"] == "udacity-import"
    assert sidecar["colour_preset"] == "default" and sidecar["track_seed"] == 0
    assert sidecar["cameras"] == ["center", "left", "right"]
    assert arrays["observations"].shape == (4, 160, 320, 3) and arrays["observations"].dtype == np.uint8
    for name in ("pose", "lateral_error", "heading_error", "progress", "rewards"):
        assert np.isnan(arrays[name]).all(), name
    assert arrays["state"].shape == (4, 0)
    assert not arrays["terminations"].any() and arrays["truncations"].tolist() == [False, False, True]


def test_centre_only_recording_has_no_side_arrays(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=4, side_cameras=False)
    result = import_recording(rec.folder, tmp_path / "out")
    assert result.cameras == ("center",)
    [(sidecar, arrays)] = episodes(tmp_path / "out")
    assert "left_observations" not in arrays and "right_observations" not in arrays
    assert sidecar["cameras"] == ["center"]


def test_a_drive_is_cut_into_episodes_that_share_their_boundary_frame(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=36, side_cameras=False)
    result = import_recording(rec.folder, tmp_path / "out", ImportConfig(episode_length=10, first_seed=5))
    loaded = episodes(tmp_path / "out")
    # 35 steps: 10 + 10 + the remainder 15 (never a stub shorter than the episode length)
    assert [s["n_steps"] for s, _ in loaded] == [10, 10, 15] and result.steps == 35
    assert [s["track_seed"] for s, _ in loaded] == [5, 6, 7]
    assert [s["episode_id"] for s, _ in loaded] == ["udacity_seed000005", "udacity_seed000006", "udacity_seed000007"]
    assert [s["termination_reason"] for s, _ in loaded] == ["chunk", "chunk", "end_of_log"]
    for (_, a), (_, b) in zip(loaded, loaded[1:]):
        np.testing.assert_array_equal(a["observations"][-1], b["observations"][0])
    labels = np.concatenate([a["actions"] for _, a in loaded])
    np.testing.assert_allclose(labels, rec.actions[:35], atol=1e-6)  # every row but the last is a step, once
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["n_episodes"] == 3 and manifest["n_steps"] == 35


def test_missing_and_unreadable_images_are_all_listed_and_nothing_is_written(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=8, header=True)
    rec.image("center", 2).unlink()
    rec.image("left", 5).unlink()
    rec.image("right", 6).write_bytes(b"not a jpeg")
    with pytest.raises(UdacityImportError) as error:
        import_recording(rec.folder, tmp_path / "out")
    message = str(error.value)
    assert "3 image(s) missing or unreadable (pass --skip-missing" in message
    assert f"line {rec.line(2)}, center: 'IMG/center_0002.jpg' not found" in message
    assert f"line {rec.line(5)}, left: 'IMG/left_0005.jpg' not found" in message
    assert f"line {rec.line(6)}, right: 'IMG/right_0006.jpg' is unreadable" in message
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["rec"]  # no staging folder left behind


def test_skip_missing_leaves_out_those_rows_and_never_spans_the_gap(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=12)
    rec.image("center", 4).unlink()
    rec.image("right", 5).unlink()
    result = import_recording(rec.folder, tmp_path / "out", ImportConfig(skip_missing=True))
    assert result.skipped_rows == 2 and len(result.problems) == 2 and result.problems.lines()[0].startswith("line 5, center")
    loaded = episodes(tmp_path / "out")
    # rows 0-3 (3 steps) and rows 6-11 (5 steps)
    assert [s["n_steps"] for s, _ in loaded] == [3, 5]
    assert [s["termination_reason"] for s, _ in loaded] == ["skipped_rows", "end_of_log"]
    assert [s["recording"]["lines"] for s, _ in loaded] == [[1, 4], [7, 12]]
    np.testing.assert_array_equal(loaded[1][1]["observations"][0], rec.rgb("center", 6))


def test_wrong_image_size_is_a_problem(tmp_path):
    import cv2

    rec = write_recording(tmp_path / "rec", rows=3)
    cv2.imwrite(str(rec.image("center", 1)), np.zeros((80, 160, 3), dtype=np.uint8))
    with pytest.raises(UdacityImportError, match=r"line 2, center: .* is 160×80 pixels \(.*\), expected 320×160"):
        import_recording(rec.folder, tmp_path / "out")


def test_an_image_declaring_a_huge_size_is_refused_before_decoding(tmp_path, monkeypatch):
    import cv2

    import nsacdrive.data_collection.udacity_import as module

    rec = write_recording(tmp_path / "rec", rows=3, side_cameras=False)
    rec.image("center", 1).write_bytes(jpeg_header(12000, 12000))
    decoded, decode = [], cv2.imdecode
    monkeypatch.setattr(module.cv2, "imdecode", lambda data, flags: decoded.append(len(data)) or decode(data, flags))
    with pytest.raises(UdacityImportError, match=r"line 2, center: 'IMG/center_0001.jpg' is 12000×12000 pixels"):
        import_recording(rec.folder, tmp_path / "out")
    assert len(jpeg_header(12000, 12000)) not in decoded and len(decoded) == 2


def _outside_recording(tmp_path: Path) -> tuple[Path, Path]:
    """A recording whose rows 1-3 name images outside it: an existing file by ``..``, a missing one
    by ``..``, and the existing one by absolute path; row 4's IMG file is a symlink to it."""
    rec = write_recording(tmp_path / "rec", rows=6, side_cameras=False)
    outside = tmp_path / "elsewhere" / "secret.jpg"
    outside.parent.mkdir()
    outside.write_bytes(rec.image("center", 1).read_bytes())
    rec.image("center", 4).unlink()
    rec.image("center", 4).symlink_to(outside)
    lines = (rec.folder / "driving_log.csv").read_text().splitlines()
    for row, written in ((1, "../elsewhere/secret.jpg"), (2, "../elsewhere/missing.jpg"), (3, str(outside))):
        lines[row] = lines[row].replace(f"IMG/center_{row:04d}.jpg", written)
    (rec.folder / "driving_log.csv").write_text("\n".join(lines) + "\n")
    return rec.folder, outside


def test_image_paths_outside_the_recording_are_refused_alike_whether_they_exist_or_not(tmp_path):
    folder, outside = _outside_recording(tmp_path)
    with pytest.raises(UdacityImportError) as error:
        import_recording(folder, tmp_path / "out")
    message, root = str(error.value), folder.resolve()
    assert "4 image(s) missing or unreadable" in message
    assert (f"line 2, center: '../elsewhere/secret.jpg' is outside the recording folder {root} and IMG/secret.jpg "
            "is not in it (pass --allow-outside to read it)") in message
    assert (f"line 3, center: '../elsewhere/missing.jpg' is outside the recording folder {root} and IMG/missing.jpg "
            "is not in it (pass --allow-outside to read it)") in message  # the same words: existence is not told
    assert f"line 4, center: '{outside}' is outside the recording folder {root} and IMG/secret.jpg is not in it" in message
    assert (f"line 5, center: 'IMG/center_0004.jpg' is outside the recording folder {root} "
            "(pass --allow-outside to read it)") in message  # a symlink out of the folder
    result = import_recording(folder, tmp_path / "out", ImportConfig(skip_missing=True, allow_outside=True))
    assert result.skipped_rows == 1 and "line 3, center: '../elsewhere/missing.jpg' not found" in str(result.problems.listed[0])


def test_a_path_mapped_into_the_recordings_img_folder_is_inside(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=3, side_cameras=False)
    log = rec.folder / "driving_log.csv"
    log.write_text(log.read_text().replace("IMG/center_0001.jpg", "../../../../etc/IMG/center_0001.jpg"))
    assert import_recording(rec.folder, tmp_path / "out").steps == 2


def test_second_import_into_the_same_folder_needs_other_seeds(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=4)
    import_recording(rec.folder, tmp_path / "out")
    with pytest.raises(UdacityImportError, match="already holds episodes \\['udacity_seed000000'\\]"):
        import_recording(rec.folder, tmp_path / "out")
    import_recording(rec.folder, tmp_path / "out", ImportConfig(first_seed=100))
    assert [s["track_seed"] for s, _ in episodes(tmp_path / "out")] == [0, 100]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["n_episodes"] == 2


def _finished_pid() -> int:
    """The pid of a process that has already ended."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(child.stdout)


def test_an_import_removes_the_staging_folder_a_killed_import_left_and_keeps_a_running_ones(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=4)
    killed = tmp_path / f".out.{_finished_pid()}.partial"
    running = tmp_path / f".out.{os.getppid()}.partial"  # pytest's parent process: alive
    for stage in (killed, running):
        stage.mkdir()
        (stage / "udacity_seed000000.npz").write_bytes(b"half written")
    import_recording(rec.folder, tmp_path / "out")
    assert not killed.exists() and running.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, "out", "rec"])


def test_the_import_cache_is_rebuilt_without_the_leftovers_of_a_killed_build(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=4)
    pid = _finished_pid()
    for leftover in (f"{CACHE_NAME}.{pid}.partial", f"{CACHE_NAME}.{pid}.stale"):
        (rec.folder / leftover).mkdir()
    assert udacity_dataset(rec.folder) == rec.folder / CACHE_NAME
    assert not [p.name for p in rec.folder.iterdir() if p.name.startswith(CACHE_NAME + ".")]


@pytest.mark.parametrize("length", [0, 1001, 10**12])
def test_import_config_is_validated(length):
    with pytest.raises(ValueError, match=rf"--episode-length must be in \[1, 1000\], got {length}"):
        ImportConfig(episode_length=length)


# --------------------------------------------------------------------------- command line and data info


def test_cli_imports_and_data_info_summarises(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=9, paths="foreign")
    result = invoke("udacity", "import", rec.folder, "--out", tmp_path / "data", "--episode-length", 4, "--seed", 3)
    assert result.exit_code == 0, result.output
    assert ("imported 2 episodes (8 steps; track seeds 3-4; cameras center,left,right) from 9 log rows "
            f"(no header, 0 skipped) → {tmp_path / 'data'}") in normalize(result.output)
    info = invoke("data", "info", tmp_path / "data")
    assert info.exit_code == 0, info.output
    assert "frame kinds udacity (2)" in normalize(info.output)
    assert "camera FOV 65° (2)" in normalize(info.output)  # a recording names no camera: the simulator's default
    assert "sources udacity-import (2)" in normalize(info.output)
    assert "episode reward -" in normalize(info.output) and "lap finished -" in normalize(info.output)
    as_json = json.loads(invoke("data", "info", tmp_path / "data", "--json").output)
    assert as_json["frame_kinds"] == {"udacity": 2} and as_json["reward_mean"] is None
    summary = summarize(tmp_path / "data")
    assert summary.frames == 8 and summary.seeds == [3, 4]


def test_cli_lists_missing_images_and_skips_them_on_request(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=6)
    rec.image("center", 1).unlink()
    rec.image("left", 3).unlink()
    failed = invoke("udacity", "import", rec.folder, "--out", tmp_path / "data")
    assert failed.exit_code == 2
    text = normalize(failed.output)
    assert "2 image(s) missing or unreadable" in text and "line 2, center" in text and "line 4, left" in text
    skipped = invoke("udacity", "import", rec.folder, "--out", tmp_path / "data", "--skip-missing")
    assert skipped.exit_code == 0, skipped.output
    assert "skipped line 2, center" in normalize(skipped.output) and "2 skipped" in normalize(skipped.output)


def test_cli_caps_the_skipped_listing_and_reads_outside_paths_on_request(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=MAX_LISTED + 8, side_cameras=False)
    for row in range(1, MAX_LISTED + 6):
        rec.image("center", row).unlink()
    skipped = invoke("udacity", "import", rec.folder, "--out", tmp_path / "data", "--skip-missing")
    assert skipped.exit_code == 0, skipped.output
    text = normalize(skipped.output)
    assert text.count("skipped line ") == MAX_LISTED and "skipped … and 5 more missing or unreadable images" in text
    folder, _ = _outside_recording(tmp_path / "outside")
    refused = invoke("udacity", "import", folder, "--out", tmp_path / "refused")
    assert refused.exit_code == 2 and "(pass --allow-outside to read it)" in normalize(refused.output)
    allowed = invoke("udacity", "import", folder, "--out", tmp_path / "allowed", "--allow-outside", "--skip-missing")
    assert allowed.exit_code == 0, allowed.output
    assert "1 skipped" in normalize(allowed.output)


# --------------------------------------------------------------------------- the episode format extension


def test_sidecars_without_frame_kind_read_as_carracing(tmp_path):
    arrays = synthetic_arrays(3)
    path = write_raw_episode(tmp_path, "old", encode_raw(arrays), 3)  # a sidecar as written before the field
    assert "frame_kind" not in json.loads(path.read_text())
    sidecar, loaded = load_episode_arrays(path)
    assert loaded["observations"].shape == (4, 96, 96, 3)
    sidecar, _ = write_synthetic(tmp_path, "new", 3, track_seed=0)
    assert sidecar["frame_kind"] == "carracing"


def test_frame_kind_and_side_arrays_are_validated(tmp_path):
    path = write_raw_episode(tmp_path, "bad", encode_raw(synthetic_arrays(2)), 2, frame_kind="carla")
    with pytest.raises(EpisodeFileError, match="sidecar field 'frame_kind' must be one of"):
        read_sidecar(path)
    path = write_raw_episode(tmp_path, "wrong", encode_raw(synthetic_arrays(2)), 2, frame_kind="udacity")
    with pytest.raises(EpisodeFileError, match=r"array 'observations' has shape \(3, 96, 96, 3\)"):
        load_episode_arrays(path)
    arrays = synthetic_arrays(2)
    arrays["left_observations"] = arrays["observations"][:2]
    with pytest.raises(EpisodeFileError, match="array 'left_observations' has shape"):
        write_episode(tmp_path, "short-left", arrays, {"track_seed": 0})
    with pytest.raises(EpisodeFileError, match="unknown arrays \\['rear_observations'\\]"):
        write_episode(tmp_path, "rear", {**synthetic_arrays(2), "rear_observations": arrays["observations"]}, {})


def test_side_cameras_can_stay_undecoded(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=3)
    import_recording(rec.folder, tmp_path / "out")
    [path] = sidecar_paths(tmp_path / "out")
    _, arrays = load_episode_arrays(path, side_cameras=False)
    assert "observations" in arrays and "left_observations" not in arrays
    _, arrays = load_episode_arrays(path, include_observations=False)
    assert "observations" not in arrays


# --------------------------------------------------------------------------- udacity:DIR


def test_udacity_prefix_imports_once_into_a_cache_and_reimports_when_the_log_changes(tmp_path, monkeypatch):
    import nsacdrive.data_collection.udacity_import as module

    rec = write_recording(tmp_path / "rec", rows=5)
    calls = []
    original = module.import_recording
    monkeypatch.setattr(module, "import_recording", lambda *a, **k: calls.append(a) or original(*a, **k))
    [root] = dataset_roots(f"udacity:{rec.folder}")
    assert root == rec.folder / CACHE_NAME and len(calls) == 1
    assert [p.name for p in sidecar_paths(root)] == ["udacity_seed000000.json"]
    assert udacity_dataset(rec.folder) == root and len(calls) == 1  # cached
    log = rec.folder / "driving_log.csv"
    log.write_text("\n".join(log.read_text().splitlines()[:3]) + "\n")
    assert udacity_dataset(rec.folder) == root and len(calls) == 2  # the log changed: imported again
    assert load_episode_arrays(sidecar_paths(root)[0])[0]["n_steps"] == 2
    assert not [p for p in rec.folder.iterdir() if p.name.startswith(CACHE_NAME + ".")]  # no leftovers


def test_udacity_prefix_accepts_an_imported_folder_and_names_a_missing_one(tmp_path):
    rec = write_recording(tmp_path / "rec", rows=3)
    import_recording(rec.folder, tmp_path / "data")
    assert dataset_roots(f"udacity:{tmp_path / 'data'}") == [tmp_path / "data"]
    with pytest.raises(DatasetError, match="udacity:.*nowhere: folder does not exist"):
        dataset_roots(f"udacity:{tmp_path / 'nowhere'}")


def test_unwritable_recording_folder_gives_a_clear_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores folder permissions")
    rec = write_recording(tmp_path / "rec", rows=3)
    rec.folder.chmod(0o555)
    try:
        with pytest.raises(UdacityImportError, match="cannot write the import cache"):
            udacity_dataset(rec.folder)
    finally:
        rec.folder.chmod(0o755)
