"""Torch Dataset of T-frame sequences built on the fly from episode files.

* Frame stacks are never stored: a sample is the T frames ending at step t, ``frame_stride``
  steps apart, encoded for the dataset's observation kind (``ObservationKind.encode``: CarRacing
  HUD cropped, CHW; Udacity cropped, 66×200 YUV) and still **uint8**: a quarter of float32's
  bytes on their way to the model, scaled to its input range on the model's device by
  :func:`network_frames`. Every episode must hold that kind's raw frames.
* Batches are gathered whole (``__getitems__``, which DataLoader calls with a batch of indices;
  build loaders with :func:`batch_loader`): one fancy-index copy per episode out of the
  :class:`nsacdrive.data_collection.frame_store.FrameStore` (episodes decoded once, memory-mapped).
* Udacity training data is augmented per sample on the raw frames (``augment``, e.g.
  :func:`nsacdrive.controllers.udacity_augment.augment_sequence`: side cameras, flips, shifts change the
  steering label too), seeded by :meth:`SequenceDataset.reseed` and the sample index.
* ``udacity:DIR`` in a data path is a Udacity recording, imported once into a cache
  (:func:`nsacdrive.data_collection.udacity_import.udacity_dataset`), or an imported dataset folder.
* Splits are by TRACK SEED (``SeedSplit``): train/val/test seed sets are disjoint, so no track
  is seen on both sides (the published split was random per frame).
* Memory is bounded: only the small arrays of every episode stay in RAM; encoded frames are
  memory-mapped files the operating system caches. Augmented or corrupted samples need the raw
  frames: those live in an LRU cache of ``cache_episodes`` decoded episodes.
  :class:`EpisodeGroupedSampler` shuffles episodes and then samples within a small group of them,
  so either cache is hit almost always.
* Every episode is validated when the index is built (sidecar, size and sha256, dtypes,
  shapes, finite actions and speeds); a bad file raises an error naming it, or with ``on_error="skip"`` is
  left out with a warning while the other files load normally.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

from nsacdrive.common.seeds import format_seeds, parse_seeds
from nsacdrive.data_collection.episode import (
    CAMERA_ARRAYS,
    CAMERA_LABEL_ARRAYS,
    EpisodeFileError,
    camera_fov_of,
    frame_kind_of,
    load_episode_arrays,
)
from nsacdrive.data_collection.errors import DatasetError
from nsacdrive.data_collection.frame_store import FrameStore
from nsacdrive.data_collection.manifest import sidecar_paths
from nsacdrive.data_collection.udacity_import import udacity_dataset
from nsacdrive.envs.car_racing import FPS, INTRO_STEPS  # noqa: F401 (INTRO_STEPS: re-exported for nsacdrive.eval.explain.report)
from nsacdrive.envs.observation_kinds import DEFAULT_FRAME_KIND, ObservationKind, camera_fov_for, observation_kind

UDACITY_PREFIX = "udacity:"


class SequenceAugment(Protocol):
    """Augments one sample: raw frames per camera [T, H, W, 3], the labels [T, 3], a seeded
    generator, and the side cameras' own labels where the episode has them → new frames and labels."""

    def __call__(self, cameras: dict[str, np.ndarray], actions: np.ndarray, rng: np.random.Generator, *,
                 camera_actions: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class SeedSplit:
    """Disjoint track-seed sets for train / val / test, e.g. ``SeedSplit.parse("0-39", "40-44", "45-49")``."""

    train: frozenset[int]
    val: frozenset[int]
    test: frozenset[int]

    def __post_init__(self) -> None:
        for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
            shared = getattr(self, a) & getattr(self, b)
            if shared:
                raise DatasetError(f"seed split: {a}_seeds and {b}_seeds share track seeds {format_seeds(shared)}; "
                                   "a track belongs to one split only")

    @classmethod
    def parse(cls, train: str, val: str, test: str) -> "SeedSplit":
        return cls(
            frozenset(parse_seeds(train, "train_seeds")),
            frozenset(parse_seeds(val, "val_seeds")),
            frozenset(parse_seeds(test, "test_seeds")),
        )

    def seeds(self, split: Literal["train", "val", "test"]) -> frozenset[int]:
        if split not in ("train", "val", "test"):
            raise DatasetError(f"split must be train, val or test, got {split!r}")
        return getattr(self, split)


@dataclass(frozen=True)
class EpisodeRecord:
    sidecar_path: Path
    sidecar: dict[str, Any]
    actions: np.ndarray  # labels used as targets: the expert's action at each step
    executed_actions: np.ndarray
    speed: np.ndarray  # measured forward speed at every frame (n_steps + 1)
    #: side camera → the expert's labels for its frames, where the episode has them
    camera_actions: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n_steps(self) -> int:
        return int(self.sidecar["n_steps"])


def dataset_roots(data: str | Path | Sequence[str | Path]) -> list[Path]:
    """One or more dataset folders: a path, a comma-separated list (``data/bc,runs/dagger/round-1/data``)
    or a sequence of paths — DAgger trains on the union of the demonstrations and every round."""
    roots = [_dataset_folder(part) for part in _data_parts(data)]
    if not roots:
        raise DatasetError(f"no dataset folder given in {data!r}")
    for root in roots:
        if not root.is_dir():
            raise DatasetError(f"{root}: dataset folder does not exist")
    return roots


def _data_parts(data: str | Path | Sequence[str | Path]) -> list[str]:
    """The non-empty folder names of a data path (see :func:`dataset_roots`)."""
    parts = str(data).split(",") if isinstance(data, (str, Path)) else [str(d) for d in data]
    return [part.strip() for part in parts if part.strip()]


def is_udacity_data(data: str | Path | Sequence[str | Path]) -> bool:
    """Whether a data path names a Udacity recording (``udacity:DIR``)."""
    return any(part.startswith(UDACITY_PREFIX) for part in _data_parts(data))


def _dataset_folder(part: str) -> Path:
    """A folder named in a data path; ``udacity:DIR`` resolves to DIR's imported dataset."""
    if not part.startswith(UDACITY_PREFIX):
        return Path(part)
    return udacity_dataset(part[len(UDACITY_PREFIX):])


def load_episode_records(root: str | Path | Sequence[str | Path], seeds: Iterable[int] | None, on_error: Literal["raise", "skip"],
                         colour_presets: Iterable[str] | None = None) -> list[EpisodeRecord]:
    """Validate and index every episode in the dataset folder(s) ``root`` (see :func:`dataset_roots`)
    whose track seed is in ``seeds`` (and whose colour preset is in ``colour_presets``, when given)."""
    roots = dataset_roots(root)
    if on_error not in ("raise", "skip"):
        raise DatasetError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    wanted = None if seeds is None else set(int(s) for s in seeds)
    presets = None if colour_presets is None else set(colour_presets)
    records = []
    for folder in roots:
        claimed = set()  # episode files some sidecar names (or would name, when it is unreadable)
        for path in sidecar_paths(folder):
            claimed.add(path.with_suffix(".npz").name)
            try:
                sidecar, arrays = load_episode_arrays(path, include_observations=False)
                _check_speed(arrays["speed"], path.parent / sidecar["file"])
            except EpisodeFileError as exc:
                if on_error == "raise":
                    raise
                warnings.warn(f"skipping episode: {exc}", stacklevel=2)
                continue
            claimed.add(sidecar["file"])
            if wanted is not None and int(sidecar["track_seed"]) not in wanted:
                continue
            if presets is not None and sidecar["colour_preset"] not in presets:
                continue
            camera_actions = {camera: arrays[name] for camera, name in CAMERA_LABEL_ARRAYS.items() if name in arrays}
            records.append(EpisodeRecord(path, sidecar, arrays["expert_actions"], arrays["actions"], arrays["speed"], camera_actions))
        _warn_about_orphans(folder, claimed)
    return records


def _warn_about_orphans(folder: Path, claimed: set[str]) -> None:
    """An episode file without its JSON sidecar is not part of the dataset: say so, naming the
    first few, rather than leave it out silently."""
    orphans = sorted(p.name for p in folder.glob("*.npz") if p.name not in claimed and not p.name.startswith("."))
    if orphans:
        named = ", ".join(orphans[:3]) + (f" and {len(orphans) - 3} more" if len(orphans) > 3 else "")
        warnings.warn(f"{folder}: ignoring {len(orphans)} episode file(s) without a JSON sidecar: {named}", stacklevel=3)


def _check_speed(speed: np.ndarray, data_path: Path) -> None:
    """Speeds are a controller input (``speed_input``): one NaN frame would make the training loss NaN."""
    bad = np.flatnonzero(~np.isfinite(speed))
    if bad.size:
        raise EpisodeFileError(f"{data_path}: array 'speed' holds NaN/inf (first at step {bad[0]})")


def sequence_offsets(sequence_length: int, frame_stride: int) -> np.ndarray:
    """Step offsets of a sequence's frames relative to its newest frame: (−(T−1)·stride, …, 0)."""
    return -np.arange(sequence_length - 1, -1, -1) * frame_stride


def sequence_timestamps(sequence_length: int, frame_stride: int) -> np.ndarray:
    """Seconds relative to the newest frame, float32 — shared by training and closed-loop driving."""
    return (sequence_offsets(sequence_length, frame_stride) / FPS).astype(np.float32)


def network_frames(frames: torch.Tensor, kind: ObservationKind) -> torch.Tensor:
    """Batches' uint8 frames (…, C, H, W) → the network's float32 input, on the frames' device
    (move them first: a quarter of the bytes travel)."""
    if frames.dtype != torch.uint8:
        raise TypeError(f"network_frames expects the uint8 frames of a dataset batch, got {frames.dtype}")
    scaled = frames.to(torch.float32).div_(kind.divisor)  # in place on the new tensor: the same values, one pass less
    return scaled.add_(kind.offset) if kind.offset else scaled


def frame_kind(dataset: Dataset) -> ObservationKind:
    """The observation kind of a :class:`SequenceDataset`, also through ``torch.utils.data.Subset``s."""
    while isinstance(dataset, torch.utils.data.Subset):
        dataset = dataset.dataset
    return dataset.kind


def collate_batch(samples: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """DataLoader's collate for :class:`SequenceDataset`: its batches arrive already gathered."""
    return samples if isinstance(samples, dict) else default_collate(samples)


def batch_loader(dataset: Dataset, batch_size: int, sampler: Sampler[int] | None = None, shuffle: bool = False,
                 pin_memory: bool = False) -> DataLoader:
    """A single-process DataLoader that gathers each batch in one ``__getitems__`` call; ``pin_memory``
    (for a CUDA device) lets batches move to it asynchronously."""
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=shuffle, num_workers=0, collate_fn=collate_batch,
                      pin_memory=pin_memory)


class SequenceDataset(Dataset):
    """Samples ``(frames[T,C,H,W] uint8, action[3], action_sequence[T,3], timestamps[T], speed[T])``.

    ``timestamps`` are seconds relative to the newest frame (…, −2·stride/50, −stride/50, 0);
    the target ``action`` is the expert label at the newest frame; ``speed`` is the car's measured
    forward speed at each frame (for controllers with ``speed_input``). ``observation`` is the
    observation kind (frames and preprocessing, :mod:`nsacdrive.envs.observation_kinds`); ``skip_intro``
    defaults to that kind's intro steps. ``augment`` (training only) rewrites each sample's raw
    frames and labels with a generator seeded from (:meth:`reseed`'s seed, sample index).
    ``corruption(frame, track seed, step)`` (evaluation) rewrites every raw frame, e.g. a
    :class:`nsacdrive.envs.corruptions.CorruptionSpec`. ``camera_fov`` (``udacity``; None: the
    default camera) is the front camera every episode must have been recorded with.
    """

    def __init__(
        self,
        root: str | Path | Sequence[str | Path],
        seeds: Iterable[int] | None = None,
        sequence_length: int = 4,
        frame_stride: int = 1,
        skip_intro: int | None = None,
        cache_episodes: int = 4,
        on_error: Literal["raise", "skip"] = "raise",
        colour_presets: Iterable[str] | None = None,
        observation: str = DEFAULT_FRAME_KIND,
        augment: SequenceAugment | None = None,
        corruption: Callable[[np.ndarray, int, int], np.ndarray] | None = None,
        camera_fov: float | None = None,
    ) -> None:
        self.kind = observation_kind(observation, "SequenceDataset observation")
        camera_fov = camera_fov_for(observation, camera_fov, "SequenceDataset camera_fov")
        skip_intro = self.kind.intro_steps if skip_intro is None else skip_intro
        if sequence_length < 1 or frame_stride < 1 or skip_intro < 0 or cache_episodes < 1:
            raise DatasetError(
                "sequence_length and frame_stride must be >= 1, skip_intro >= 0, cache_episodes >= 1; got "
                f"{sequence_length}, {frame_stride}, {skip_intro}, {cache_episodes}"
            )
        self.roots = dataset_roots(root)
        self.sequence_length = sequence_length
        self.frame_stride = frame_stride
        self.cache_episodes = cache_episodes
        self.on_error = on_error
        self.augment = augment
        self.augment_seed = 0
        self.corruption = corruption
        self.episodes = load_episode_records(self.roots, seeds, on_error, colour_presets)
        for record in self.episodes:
            if frame_kind_of(record.sidecar) != self.kind.name:
                raise DatasetError(f"{record.sidecar_path}: holds {frame_kind_of(record.sidecar)} frames, but this dataset reads "
                                   f"{self.kind.name} observations (the model config's 'observation'; Udacity data: --data udacity:DIR)")
            recorded_fov = camera_fov_of(record.sidecar)
            if recorded_fov != camera_fov:
                raise DatasetError(f"{record.sidecar_path}: recorded with a {recorded_fov:g}° front camera, but this "
                                   f"dataset reads {camera_fov:g}° frames; set the model config's 'camera_fov' to the recording's "
                                   "(a controller drives with the camera it was trained on)")
        first_end = skip_intro + (sequence_length - 1) * frame_stride
        index = [
            np.stack([np.full(max(r.n_steps - first_end, 0), i), np.arange(first_end, max(r.n_steps, first_end))], axis=1)
            for i, r in enumerate(self.episodes)
        ]
        self.index = np.concatenate(index) if index else np.zeros((0, 2), dtype=np.int64)
        self._offsets = sequence_offsets(sequence_length, frame_stride)  # oldest … newest
        self.timestamps = torch.from_numpy(sequence_timestamps(sequence_length, frame_stride))
        self._cache: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._store = FrameStore(self.kind)
        self._encoded_frames: dict[int, np.ndarray] = {}
        # every episode's labels and speeds in one array (n_steps + 1 rows each: speeds have one
        # more than actions), so a batch's are one fancy index
        rows = np.array([r.n_steps + 1 for r in self.episodes], dtype=np.int64)
        self._first_row = np.concatenate([[0], np.cumsum(rows)])[:-1].astype(np.int64)
        self._labels = np.zeros((int(rows.sum()), 3), dtype=np.float32)
        self._speeds = np.zeros(int(rows.sum()), dtype=np.float32)
        for record, first in zip(self.episodes, self._first_row, strict=True):
            self._labels[first:first + record.n_steps] = record.actions
            self._speeds[first:first + record.n_steps + 1] = record.speed

    def __len__(self) -> int:
        return len(self.index)

    @property
    def track_seeds(self) -> list[int]:
        return sorted({int(r.sidecar["track_seed"]) for r in self.episodes})

    def episode_of(self, item: int) -> int:
        return int(self.index[item, 0])

    def reseed(self, seed: int) -> None:
        """Seed of the augmentation (the trainer sets one per epoch)."""
        self.augment_seed = int(seed)

    def _frames(self, episode: int) -> dict[str, np.ndarray]:
        """Raw frames of every camera kept for ``episode`` (side cameras only when augmenting)."""
        if episode in self._cache:
            self._cache.move_to_end(episode)
            return self._cache[episode]
        record = self.episodes[episode]
        _, arrays = load_episode_arrays(record.sidecar_path, include_observations=True, side_cameras=self.augment is not None)
        frames = {camera: arrays[name] for camera, name in CAMERA_ARRAYS.items() if name in arrays}
        self._cache[episode] = frames
        while len(self._cache) > self.cache_episodes:
            self._cache.popitem(last=False)
        return frames

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        return {key: value[0] for key, value in self.__getitems__([item]).items()}

    def __getitems__(self, items: Sequence[int]) -> dict[str, torch.Tensor]:
        """A whole batch, its rows grouped by episode (stable: the sampler's order within an
        episode): each episode's frames are then one copy out of the frame store into a slice of
        the batch. Labels and speeds are one fancy index each; augmented or corrupted samples take
        the raw-frame path."""
        items = np.asarray(items, dtype=np.int64)
        items = items[np.argsort(self.index[items, 0], kind="stable")]
        episodes, newest = self.index[items, 0], self.index[items, 1]
        steps = newest[:, None] + self._offsets  # (B, T)
        rows = self._first_row[episodes][:, None] + steps
        labels, speed = self._labels[rows], self._speeds[rows]
        if self.augment is None and self.corruption is None:
            frames = np.empty((len(items), self.sequence_length, *self.kind.frame_shape), dtype=np.uint8)
            bounds = np.flatnonzero(np.diff(episodes)) + 1
            for start, stop in zip([0, *bounds.tolist()], [*bounds.tolist(), len(items)], strict=True):
                np.take(self._encoded(int(episodes[start])), steps[start:stop], axis=0, out=frames[start:stop])
        else:
            frames, labels = self._raw_samples(items, episodes, steps)
        return {
            "frames": torch.from_numpy(frames),
            "action": torch.from_numpy(np.ascontiguousarray(labels[:, -1])),
            "action_sequence": torch.from_numpy(labels),
            "speed": torch.from_numpy(speed),
            "timestamps": self.timestamps.repeat(len(items), 1),  # its own memory: a CUDA loader pins every tensor
            "episode": torch.from_numpy(episodes),
            "step": torch.from_numpy(newest),
        }

    def _encoded(self, episode: int) -> np.ndarray:
        """The episode's encoded frames from the frame store (memory-mapped, opened once)."""
        frames = self._encoded_frames.get(episode)
        if frames is None:
            record = self.episodes[episode]
            frames = self._encoded_frames[episode] = self._store.frames(record.sidecar_path, record.sidecar)
        return frames

    def _raw_samples(self, items: np.ndarray, episodes: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Encoded frames [B, T, C, H, W] and labels [B, T, 3] of a batch on the raw-frame path,
        its samples spread over torch's intra-op threads (augmentation, corruption and encoding are
        OpenCV and NumPy work that releases the GIL). The same whatever the thread count: each
        sample is seeded by its own index."""
        # the episodes' frames are looked up here, on the calling thread: the cache is not thread-safe
        sources = {episode: (self._frames(episode), self.episodes[episode]) for episode in np.unique(episodes).tolist()}

        def gather(job: tuple[int, int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
            item, episode, sample_steps = job
            frames, labels = self._raw_sample(item, *sources[episode], sample_steps)
            return self.kind.encode(frames), labels

        jobs = list(zip(items.tolist(), episodes.tolist(), steps, strict=True))
        threads = min(torch.get_num_threads(), len(jobs))
        samples = list(map(gather, jobs) if threads <= 1 else gather_pool(threads).map(gather, jobs))
        return np.stack([frames for frames, _ in samples]), np.stack([labels for _, labels in samples]).astype(np.float32)

    def _raw_sample(self, item: int, cameras: dict[str, np.ndarray], record: EpisodeRecord,
                    steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw frames and labels of one sample of ``record`` (its raw ``cameras``), augmented (seeded by
        the epoch and the item) and corrupted (each frame by its track seed and step: overlapping sequences agree)."""
        labels = record.actions[steps]
        if self.augment is None:
            frames = cameras["center"][steps]
        else:
            rng = np.random.default_rng([self.augment_seed, item])
            window = slice(int(steps[0]), int(steps[-1]) + 1, self.frame_stride)  # the sample's frames as views, not copies
            frames, labels = self.augment({camera: raw[window] for camera, raw in cameras.items()}, labels, rng,
                                          camera_actions={camera: side[steps] for camera, side in record.camera_actions.items()})
        if self.corruption is not None:
            seed = int(record.sidecar["track_seed"])
            frames = np.stack([self.corruption(frame, seed, int(s)) for frame, s in zip(frames, steps, strict=True)])
        return frames, labels


@functools.cache
def gather_pool(threads: int) -> ThreadPoolExecutor:
    """The process's threads for gathering raw-frame batches (one pool per size, made on first use)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="nsacdrive-gather")


os.register_at_fork(after_in_child=gather_pool.cache_clear)  # a forked child has none of its parent's threads


class EpisodeGroupedSampler(Sampler[int]):
    """Shuffle episodes, then visit the samples of ``group_size`` episodes at a time in random
    order: random enough for SGD, and every group fits the dataset's frame cache.

    ``passes`` > 1 visits the data that many times per epoch, each pass shuffled afresh (a small
    recording then gets as many gradient steps per epoch as a large dataset)."""

    def __init__(self, dataset: SequenceDataset, group_size: int | None = None, seed: int = 0, passes: int = 1) -> None:
        self.dataset = dataset
        self.group_size = group_size or dataset.cache_episodes
        if self.group_size > dataset.cache_episodes:
            raise DatasetError(f"group_size {self.group_size} exceeds the dataset's cache_episodes {dataset.cache_episodes}")
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes}")
        self.seed, self.passes = seed, passes
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset) * self.passes

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch])
        episodes = self.dataset.index[:, 0]
        for _ in range(self.passes):
            order = rng.permutation(len(self.dataset.episodes))
            for start in range(0, len(order), self.group_size):
                group = order[start : start + self.group_size]
                items = np.flatnonzero(np.isin(episodes, group))
                yield from rng.permutation(items).tolist()
