"""Decoded frames of every episode, once, as memory-mapped uint8 arrays in the network's layout.

Episode files are deflate-compressed zips: decoding one costs tens of milliseconds and its sha256
check as much again. A training run reads each episode hundreds of times, so the frame store
decodes an episode once, encodes its frames for the observation kind (``ObservationKind.encode``:
cropped, channels first, still uint8) and writes them as an uncompressed ``.npy`` file that later
reads memory-map. Pages then live in the operating system's cache, shared by every process
(DataLoader workers, parallel trainings) and evicted under memory pressure, so no frame cache of
our own bounds memory.

A cached file is named by the episode's sha256 and the kind's preprocessing version, so an episode
that is replaced, or a changed preprocessing, never reads stale frames. Files are written to a
temporary name and renamed (atomic). The cache lives in ``<dataset>/.frames/``; a dataset folder
that cannot be written (a read-only share) keeps its cache under ``$NSACDRIVE_FRAME_CACHE`` or
``~/.cache/nsacdrive/frames``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from nsacdrive.common.atomic import atomic_path
from nsacdrive.data_collection.episode import load_episode_arrays
from nsacdrive.envs.observation_kinds import ObservationKind

CACHE_FOLDER = ".frames"


def fallback_cache_root() -> Path:
    """Where frames of datasets in read-only folders are cached."""
    return Path(os.environ.get("NSACDRIVE_FRAME_CACHE", Path.home() / ".cache" / "nsacdrive" / "frames"))


class FrameStore:
    """Encoded frames of one observation kind, decoded once per episode file and memory-mapped.

    :param kind: the observation kind whose ``encode`` prepares the frames.
    """

    def __init__(self, kind: ObservationKind) -> None:
        self.kind = kind

    def path_for(self, sidecar_path: Path, sidecar: dict) -> Path:
        """The cache file of an episode (in its dataset folder's ``.frames``)."""
        return Path(sidecar_path).parent / CACHE_FOLDER / f"{sidecar['sha256'][:24]}-{self.kind.version}-u8.npy"

    def frames(self, sidecar_path: Path, sidecar: dict) -> np.ndarray:
        """The episode's encoded frames, (n_steps + 1, C, H, W) uint8, read-only and memory-mapped:
        the cached file, made first when there is none (callers keep the array: mapping is not free)."""
        path = self.path_for(sidecar_path, sidecar)
        for candidate in (path, fallback_cache_root() / path.name):
            if candidate.exists():
                return np.load(candidate, mmap_mode="r")
        _, arrays = load_episode_arrays(Path(sidecar_path), include_observations=True, side_cameras=False)
        encoded = self.kind.encode(arrays["observations"])
        try:
            _write_npy(path, encoded)
        except OSError:  # a read-only dataset folder
            path = fallback_cache_root() / path.name
            _write_npy(path, encoded)
        return np.load(path, mmap_mode="r")


def _write_npy(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.lib.format.write_array(handle, np.ascontiguousarray(array), allow_pickle=False)
