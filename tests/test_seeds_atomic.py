"""nsacdrive.common.seeds (seed lists on the command line) and nsacdrive.common.atomic (crash-safe writes)."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsacdrive.common.atomic import (
    PARTIAL_SUFFIX,
    atomic_folder,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    remove_partial_files,
    replace_folder,
)
from nsacdrive.common.seeds import format_seeds, parse_seeds

# --------------------------------------------------------------------------- parse_seeds / format_seeds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", [0]),
        ("0-4", [0, 1, 2, 3, 4]),
        ("42,1000-1003", [42, 1000, 1001, 1002, 1003]),
        ("5,1-2", [5, 1, 2]),  # order kept, not sorted
        (" 3 , 7 - 8 ", [3, 7, 8]),  # whitespace tolerated
        ("9-9", [9]),
        ("007", [7]),
    ],
)
def test_parse_seeds_examples(text, expected):
    assert parse_seeds(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "cannot parse"),
        ("abc", "cannot parse 'abc'"),
        ("1,,2", "cannot parse ''"),
        ("-1", "cannot parse '-1'"),
        ("1-", "cannot parse '1-'"),
        ("1.5", "cannot parse '1.5'"),
        ("1-2-3", "cannot parse '1-2-3'"),
        ("5-3", "range '5-3' runs backwards"),
        ("1,1", "seeds listed twice: [1]"),
        ("0-3,2-5", "seeds listed twice: [2, 3]"),
    ],
)
def test_parse_seeds_errors_name_argument_and_problem(text, fragment):
    with pytest.raises(ValueError) as excinfo:
        parse_seeds(text)
    message = str(excinfo.value)
    assert message.startswith("--seeds: ")
    assert fragment in message


def test_parse_seeds_uses_given_argument_name():
    with pytest.raises(ValueError, match=r"^train seeds: "):
        parse_seeds("x", "train seeds")


@pytest.mark.parametrize(
    ("seeds", "text"),
    [
        ([0, 1, 2, 5], "0-2,5"),
        ([5, 0, 2, 1], "0-2,5"),
        ([7], "7"),
        ([1, 3, 5], "1,3,5"),
        ([10, 11, 20, 21, 22, 30], "10-11,20-22,30"),
        ({4, 3}, "3-4"),
        ([2, 2, 3], "2-3"),  # duplicates collapse
        ([], ""),
    ],
)
def test_format_seeds_examples(seeds, text):
    assert format_seeds(seeds) == text


@given(st.sets(st.integers(min_value=0, max_value=5000), min_size=1, max_size=80))
def test_format_then_parse_round_trip(seeds):
    text = format_seeds(seeds)
    assert parse_seeds(text) == sorted(seeds)
    # format is canonical: formatting the parsed list again gives the same text
    assert format_seeds(parse_seeds(text)) == text
    # and compact: one part per maximal run of consecutive seeds
    runs = 1 + sum(1 for a, b in zip(sorted(seeds), sorted(seeds)[1:]) if b != a + 1)
    assert len(text.split(",")) == runs


@given(st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=30, unique=True))
def test_parse_keeps_order_of_listed_seeds(seeds):
    assert parse_seeds(",".join(map(str, seeds))) == seeds


def test_a_hundred_thousand_listed_seeds_parse_in_order():
    seeds = [(7919 * k) % 100_003 for k in range(100_000)]  # distinct (100003 is prime), scrambled
    assert parse_seeds(",".join(map(str, seeds))) == seeds


@pytest.mark.parametrize(("text", "fragment"), [
    ("0-999999999999", "seed 999999999999 in '0-999999999999' is above the largest seed, 4294967295"),
    ("0-999999,1000000-1000001", "names more than 1,000,000 seeds"),
    ("1" * 30, "cannot parse"),
])
def test_seed_lists_are_bounded_before_they_are_expanded(text, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_seeds(text)


def test_duplicates_among_many_seeds_are_all_named_sorted():
    text = ",".join(map(str, range(100_000))) + ",99999,5,0-2"
    with pytest.raises(ValueError, match=r"seeds listed twice: \[0, 1, 2, 5, 99999\]$"):
        parse_seeds(text)


# --------------------------------------------------------------------------- atomic writes


def _partials(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(PARTIAL_SUFFIX))


def test_atomic_write_bytes_creates_parents_and_leaves_no_partial(tmp_path):
    target = tmp_path / "a" / "b" / "file.bin"
    atomic_write_bytes(target, b"\x00\x01hello")
    assert target.read_bytes() == b"\x00\x01hello"
    assert list(target.parent.iterdir()) == [target]


def test_atomic_write_has_normal_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    target = tmp_path / "perm.bin"
    atomic_write_bytes(target, b"x")
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_atomic_write_replaces_existing_file_atomically(tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(b"old contents")
    with open(target, "rb") as reader:  # a reader that opened the old file keeps seeing it
        old_inode = os.fstat(reader.fileno()).st_ino
        atomic_write_bytes(target, b"new")
        assert reader.read() == b"old contents"
    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != old_inode  # replaced by rename, not rewritten in place
    assert _partials(tmp_path) == []


def test_atomic_path_failure_keeps_old_file_and_removes_temp(tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    seen = []
    with pytest.raises(RuntimeError, match="crash"):
        with atomic_path(target) as tmp:
            seen.append(tmp)
            assert tmp.parent == tmp_path
            assert tmp.name.startswith(".data.bin.") and tmp.name.endswith(PARTIAL_SUFFIX)
            tmp.write_bytes(b"half-writ")
            raise RuntimeError("crash")
    assert target.read_bytes() == b"old"
    assert not seen[0].exists()
    assert list(tmp_path.iterdir()) == [target]


def test_atomic_folder_appears_complete_with_normal_permissions_or_not_at_all(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    with pytest.raises(RuntimeError, match="crash"):
        with atomic_folder(tmp_path / "unit") as stage:
            assert stage.parent == tmp_path and stage.name.startswith(".unit.") and stage.name.endswith(PARTIAL_SUFFIX)
            (stage / "half").write_bytes(b"x")
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []
    with atomic_folder(tmp_path / "unit") as stage:
        (stage / "file").write_bytes(b"whole")
        assert not (tmp_path / "unit").exists()
    assert (tmp_path / "unit" / "file").read_bytes() == b"whole" and list(tmp_path.iterdir()) == [tmp_path / "unit"]
    assert (tmp_path / "unit").stat().st_mode & 0o777 == 0o777 & ~umask


def test_atomic_path_failure_without_old_file_creates_nothing(tmp_path):
    target = tmp_path / "new.bin"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_target_is_invisible_until_the_write_completes(tmp_path):
    target = tmp_path / "late.bin"
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"payload")
        assert not target.exists()
    assert target.read_bytes() == b"payload"


def test_atomic_write_json_is_sorted_indented_and_newline_terminated(tmp_path):
    target = tmp_path / "x.json"
    atomic_write_json(target, {"b": 1, "a": [1, 2]})
    text = target.read_text()
    assert text == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    assert json.loads(text) == {"a": [1, 2], "b": 1}


def test_remove_partial_files_removes_only_temp_files(tmp_path):
    keep = [tmp_path / "episode.npz", tmp_path / "episode.json", tmp_path / "notes.partial", tmp_path / ".hidden"]
    for path in keep:
        path.write_bytes(b"keep")
    leftovers = [tmp_path / ".episode.npz.abc123.partial", tmp_path / ".x.partial"]
    for path in leftovers:
        path.write_bytes(b"junk")
    (tmp_path / "sub").mkdir()
    nested = tmp_path / "sub" / ".y.partial"
    nested.write_bytes(b"junk")  # not in the folder itself: left alone

    assert remove_partial_files(tmp_path) == 2
    assert all(not p.exists() for p in leftovers)
    assert all(p.read_bytes() == b"keep" for p in keep)
    assert nested.exists()
    assert remove_partial_files(tmp_path) == 0


def test_remove_partial_files_cleans_a_real_interrupted_write(tmp_path):
    target = tmp_path / "ep.npz"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            # simulate a hard kill: the context manager's cleanup would normally run, so copy the
            # temp file aside under a temp-file name first
            crash_copy = tmp.with_name(tmp.name.replace(".partial", "-killed.partial"))
            crash_copy.write_bytes(b"half")
            raise RuntimeError
    assert _partials(tmp_path) == [crash_copy]
    assert remove_partial_files(tmp_path) == 1
    assert list(tmp_path.iterdir()) == []


def _staged(parent: Path, text: str) -> Path:
    stage = parent / f".out.{os.getpid()}{PARTIAL_SUFFIX}"
    stage.mkdir()
    (stage / "new.txt").write_text(text)
    return stage


def test_replace_folder_replaces_an_existing_folder_and_leaves_no_stale_one(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    replace_folder(_staged(tmp_path, "new"), tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # neither the stage nor a .stale copy is left
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["new.txt"]
    assert (tmp_path / "out" / "new.txt").read_text() == "new"


def test_replace_folder_creates_the_target_when_there_is_none(tmp_path):
    replace_folder(_staged(tmp_path, "new"), tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (tmp_path / "out" / "new.txt").read_text() == "new"


@pytest.mark.parametrize("accepted", [True, False])
def test_replace_folder_keeps_a_rival_that_moved_in_meanwhile_only_when_accepted(tmp_path, monkeypatch, accepted):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    stage = _staged(tmp_path, "mine")
    real_rename = os.rename

    def rival_moves_in(source, target):  # right after the old folder is moved aside
        real_rename(source, target)
        if str(target).endswith(".stale"):
            (tmp_path / "out").mkdir()
            (tmp_path / "out" / "new.txt").write_text("theirs")

    seen = []

    def accept(target):
        seen.append(target)
        return accepted

    monkeypatch.setattr(os, "rename", rival_moves_in)
    if accepted:
        replace_folder(stage, tmp_path / "out", accept_existing=accept)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", stage.name])  # stage left to the caller
    else:
        with pytest.raises(OSError):
            replace_folder(stage, tmp_path / "out", accept_existing=accept)
    assert seen == [tmp_path / "out"]
    assert (tmp_path / "out" / "new.txt").read_text() == "theirs"


def test_a_full_disk_names_the_file_being_written(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")  # what a write or fsync raises: no file named

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left") as caught:
        atomic_write_bytes(tmp_path / "out" / "manifest.json", b"{}")
    assert caught.value.filename == str(tmp_path / "out" / "manifest.json") and caught.value.errno == errno.ENOSPC
    assert list((tmp_path / "out").iterdir()) == []
