"""SequenceDataset, SeedSplit, EpisodeGroupedSampler (data_collection/dataset.py) and
summarize (data_collection/summary.py) on synthetic episodes with per-step frame markers."""

from __future__ import annotations

import collections
import gc
import json
import warnings

import numpy as np
import psutil
import pytest
import torch
from data_fixtures import preprocessed_marker, synthetic_arrays, synthetic_metadata, write_synthetic

import nsacdrive.data_collection.dataset as dataset_module
import nsacdrive.data_collection.frame_store as frame_store_module
from nsacdrive.data_collection.dataset import (
    INTRO_STEPS,
    EpisodeGroupedSampler,
    SeedSplit,
    SequenceDataset,
    batch_loader,
    network_frames,
)
from nsacdrive.data_collection.episode import EpisodeFileError, write_episode
from nsacdrive.data_collection.errors import DatasetError
from nsacdrive.data_collection.summary import ACTION_NAMES, summarize
from nsacdrive.envs.car_racing import FPS
from nsacdrive.envs.observation import encode_observation, preprocess_observation

#: (n_steps, track seed) of the shared small dataset; episode i is written as "ep0i"
EPISODES = [(30, 0), (30, 1), (25, 2), (40, 3), (12, 4), (30, 5)]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Folder with 6 textured synthetic episodes; returns (folder, [arrays per episode])."""
    root = tmp_path_factory.mktemp("small")
    arrays = []
    for i, (n_steps, seed) in enumerate(EPISODES):
        _, a = write_synthetic(root, f"ep{i:02d}", n_steps, track_seed=seed, episode=i)
        arrays.append(a)
    return root, arrays


def _count_frame_loads(monkeypatch) -> collections.Counter:
    """Count the decoding of each episode's frames (load_episode_arrays with observations), by the
    frame store or by the raw-frame cache of augmented and corrupted samples."""
    calls: collections.Counter = collections.Counter()
    original = dataset_module.load_episode_arrays

    def counting(path, include_observations=True, **kwargs):
        if include_observations:
            calls[path.stem] += 1
        return original(path, include_observations=include_observations, **kwargs)

    monkeypatch.setattr(dataset_module, "load_episode_arrays", counting)
    monkeypatch.setattr(frame_store_module, "load_episode_arrays", counting)
    return calls


def unchanged(frame: np.ndarray, seed: int, step: int) -> np.ndarray:
    """A corruption that changes nothing: it sends samples through the raw-frame path."""
    return frame


# --------------------------------------------------------------------------- sequences


@pytest.mark.parametrize(
    ("T", "stride", "skip"),
    [(1, 1, 0), (4, 1, 0), (4, 1, 10), (3, 4, 5), (2, 7, 0), (5, 3, 20)],
)
def test_sequences_return_the_right_frames_and_labels(small, T, stride, skip):
    root, arrays = small
    ds = SequenceDataset(root, sequence_length=T, frame_stride=stride, skip_intro=skip, cache_episodes=6)
    first_end = skip + (T - 1) * stride
    expected = [(e, t) for e, (n, _) in enumerate(EPISODES) for t in range(first_end, n)]
    assert len(ds) == len(expected) == sum(max(n - first_end, 0) for n, _ in EPISODES)
    offsets = -np.arange(T - 1, -1, -1) * stride
    np.testing.assert_array_equal(ds.timestamps.numpy(), (offsets / 50.0).astype(np.float32))
    for item, (e, t) in enumerate(expected):
        sample = ds[item]
        assert (int(sample["episode"]), int(sample["step"])) == (e, t)
        assert ds.episode_of(item) == e
        frames = sample["frames"].numpy()
        steps = t + offsets
        assert frames.shape == (T, 3, 84, 96) and frames.dtype == np.uint8
        np.testing.assert_array_equal(preprocessed_marker(frames), steps)  # oldest … newest
        assert np.all(frames[:, 2, 0, 0] == e)  # frames of the right episode
        np.testing.assert_array_equal(frames, encode_observation(arrays[e]["observations"][steps]))
        # scaled on the model's side: exactly the one preprocessing function's output
        np.testing.assert_array_equal(network_frames(sample["frames"], ds.kind).numpy(),
                                      preprocess_observation(arrays[e]["observations"][steps]))
        np.testing.assert_array_equal(sample["action"].numpy(), arrays[e]["expert_actions"][t])
        np.testing.assert_array_equal(sample["action_sequence"].numpy(), arrays[e]["expert_actions"][steps])
        assert torch.equal(sample["timestamps"], ds.timestamps)


def test_timestamps_for_stride_three(small):
    # documented: seconds relative to the newest frame, (…, −2·stride/50, −stride/50, 0)
    root, _ = small
    ds = SequenceDataset(root, sequence_length=4, frame_stride=3, skip_intro=0)
    assert FPS == 50
    torch.testing.assert_close(ds.timestamps, torch.tensor([-0.18, -0.12, -0.06, 0.0]))
    torch.testing.assert_close(ds[0]["timestamps"], torch.tensor([-0.18, -0.12, -0.06, 0.0]))


def test_frames_are_uint8_that_scale_to_the_unit_range(small):
    root, arrays = small
    ds = SequenceDataset(root, sequence_length=4, skip_intro=0)
    assert ds[10]["frames"].dtype == torch.uint8
    frames = network_frames(ds[10]["frames"], ds.kind)
    assert frames.dtype == torch.float32 and tuple(frames.shape) == (4, 3, 84, 96)
    assert float(frames.min()) >= 0.0 and float(frames.max()) <= 1.0
    assert float(frames.max()) == 1.0 and float(frames.min()) == 0.0  # full range of random pixels
    # the HUD (bottom 12 raw rows) is cropped: row 83 of the output is raw row 83
    raw = arrays[0]["observations"][13]
    np.testing.assert_array_equal(frames[-1, :, 83, :].numpy(), raw[83].T.astype(np.float32) / 255)


def test_labels_are_expert_actions_not_executed_actions(small):
    root, arrays = small
    ds = SequenceDataset(root, sequence_length=1, skip_intro=0)
    sample = ds[5]
    assert int(sample["episode"]) == 0 and int(sample["step"]) == 5
    np.testing.assert_array_equal(sample["action"].numpy(), arrays[0]["expert_actions"][5])
    assert not np.array_equal(sample["action"].numpy(), arrays[0]["actions"][5])


def test_default_skips_the_zoom_intro(tmp_path):
    write_synthetic(tmp_path, "long", 60, track_seed=0, textured=False)
    ds = SequenceDataset(tmp_path)  # T=4, stride 1, skip 50
    assert INTRO_STEPS == 50
    assert len(ds) == 60 - (50 + 3)
    assert int(ds[0]["step"]) == 53
    np.testing.assert_array_equal(preprocessed_marker(ds[0]["frames"].numpy()), [50, 51, 52, 53])


def test_too_short_episodes_give_no_samples(small):
    root, _ = small
    ds = SequenceDataset(root, sequence_length=3, frame_stride=10, skip_intro=0)  # first sample at step 20
    assert len(ds) == sum(max(n - 20, 0) for n, _ in EPISODES)
    assert 4 not in {ds.episode_of(i) for i in range(len(ds))}  # the 12-step episode
    assert len(ds.episodes) == 6  # still indexed
    assert len(SequenceDataset(root, sequence_length=1, skip_intro=1000)) == 0


def test_dataloader_batches(small):
    root, _ = small
    ds = SequenceDataset(root, sequence_length=3, frame_stride=2, skip_intro=0, cache_episodes=2)
    loader = batch_loader(ds, 8, EpisodeGroupedSampler(ds, seed=3))
    batch = next(iter(loader))
    assert tuple(batch["frames"].shape) == (8, 3, 3, 84, 96)
    assert tuple(batch["action"].shape) == (8, 3)
    assert tuple(batch["action_sequence"].shape) == (8, 3, 3)
    assert tuple(batch["timestamps"].shape) == (8, 3)
    assert sum(len(b["step"]) for b in loader) == len(ds)


@pytest.mark.parametrize("per_sample", [False, True])
def test_every_tensor_of_a_batch_owns_its_memory_so_a_cuda_loader_can_pin_it(small, per_sample):
    # pin_memory() refuses a tensor whose elements share memory (an expand()ed view): on a GPU
    # machine the training loader pins every batch, so each tensor must be contiguous.
    root, _ = small
    ds = SequenceDataset(root, sequence_length=3, frame_stride=2, skip_intro=0, cache_episodes=2,
                         corruption=(lambda frames, episode, step: frames) if per_sample else None)  # the raw-frame path
    batch = ds.__getitems__(list(range(8)))
    assert all(tensor.is_contiguous() for tensor in batch.values()), {k: v.stride() for k, v in batch.items()}


# --------------------------------------------------------------------------- seeds and splits


def test_seed_filtering(small):
    root, _ = small
    ds = SequenceDataset(root, seeds=[1, 4, 99], sequence_length=1, skip_intro=0)
    assert ds.track_seeds == [1, 4]
    assert [r.sidecar["track_seed"] for r in ds.episodes] == [1, 4]
    assert len(ds) == 30 + 12
    assert len(SequenceDataset(root, seeds=[], skip_intro=0)) == 0
    assert SequenceDataset(root, seeds=None, skip_intro=0).track_seeds == [0, 1, 2, 3, 4, 5]


def test_seed_split_gives_disjoint_datasets(small):
    root, _ = small
    split = SeedSplit.parse("0-2", "3", "4-5")
    assert split.train == {0, 1, 2} and split.val == {3} and split.test == {4, 5}
    parts = {name: SequenceDataset(root, seeds=split.seeds(name), sequence_length=1, skip_intro=0)
             for name in ("train", "val", "test")}
    seeds = {name: set(ds.track_seeds) for name, ds in parts.items()}
    assert seeds == {"train": {0, 1, 2}, "val": {3}, "test": {4, 5}}
    assert sum(len(ds) for ds in parts.values()) == len(SequenceDataset(root, sequence_length=1, skip_intro=0))


@pytest.mark.parametrize(
    ("train", "val", "test", "message"),
    [
        ("0-4", "4-5", "6", r"train_seeds and val_seeds share track seeds 4;"),
        ("0-4", "5", "2,3", r"train_seeds and test_seeds share track seeds 2-3;"),
        ("0", "1-3", "3", r"val_seeds and test_seeds share track seeds 3;"),
    ],
)
def test_seed_split_rejects_overlap(train, val, test, message):
    with pytest.raises(DatasetError, match=message):
        SeedSplit.parse(train, val, test)


def test_seed_split_errors():
    with pytest.raises(ValueError, match="^val_seeds: "):
        SeedSplit.parse("0-3", "x", "5")
    with pytest.raises(DatasetError, match="split must be train, val or test"):
        SeedSplit.parse("0", "1", "2").seeds("holdout")  # type: ignore[arg-type]
    with pytest.raises(DatasetError):
        SeedSplit(frozenset({1}), frozenset({1}), frozenset())


# --------------------------------------------------------------------------- sampler


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """14 small episodes of varied length (zeros + markers), one of them sample-free."""
    root = tmp_path_factory.mktemp("many")
    lengths = [12, 5, 30, 18, 7, 25, 9, 14, 2, 21, 16, 11, 8, 19]
    for i, n in enumerate(lengths):
        write_synthetic(root, f"ep{i:02d}", n, track_seed=i, episode=i, textured=False)
    return root


def _runs(episodes: list[int]) -> int:
    """Number of runs of consecutive equal episode ids in a visiting order."""
    return 1 + sum(1 for a, b in zip(episodes, episodes[1:]) if a != b)


def test_sampler_yields_a_permutation(many):
    ds = SequenceDataset(many, sequence_length=3, skip_intro=0, cache_episodes=4)
    sampler = EpisodeGroupedSampler(ds, seed=0)
    order = list(sampler)
    assert len(sampler) == len(ds) == len(order)
    assert sorted(order) == list(range(len(ds)))


def test_sampler_passes_visit_every_sample_once_per_pass_each_pass_reshuffled(many):
    ds = SequenceDataset(many, sequence_length=3, skip_intro=0, cache_episodes=4)
    sampler = EpisodeGroupedSampler(ds, seed=0, passes=3)
    order = list(sampler)
    assert len(sampler) == len(order) == 3 * len(ds)
    passes = [order[i * len(ds):(i + 1) * len(ds)] for i in range(3)]
    assert all(sorted(one) == list(range(len(ds))) for one in passes)
    assert passes[0] != passes[1] != passes[2]
    assert passes[0] == list(EpisodeGroupedSampler(ds, seed=0))  # the first pass is the one-pass order
    with pytest.raises(ValueError, match="passes must be >= 1"):
        EpisodeGroupedSampler(ds, passes=0)


def test_sampler_is_deterministic_per_seed_and_epoch(many):
    ds = SequenceDataset(many, sequence_length=3, skip_intro=0, cache_episodes=4)
    sampler = EpisodeGroupedSampler(ds, seed=11)
    epoch0 = list(sampler)
    assert list(sampler) == epoch0
    assert list(EpisodeGroupedSampler(ds, seed=11)) == epoch0
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0 and sorted(epoch1) == sorted(epoch0)
    sampler.set_epoch(0)
    assert list(sampler) == epoch0
    assert list(EpisodeGroupedSampler(ds, seed=12)) != epoch0


@pytest.mark.parametrize("group_size", [1, 2, 3, 4])
def test_sampler_visits_at_most_group_size_episodes_per_block(many, group_size):
    ds = SequenceDataset(many, sequence_length=2, skip_intro=0, cache_episodes=4)
    for seed in range(3):
        sampler = EpisodeGroupedSampler(ds, group_size=group_size, seed=seed)
        episodes = [ds.episode_of(i) for i in sampler]
        # greedy partition into blocks of <= group_size distinct episodes, never revisiting
        closed: set[int] = set()
        current: set[int] = set()
        n_blocks = 0
        for e in episodes:
            assert e not in closed, f"episode {e} revisited after its group (seed {seed})"
            if e not in current and len(current) == group_size:
                closed |= current
                current = set()
                n_blocks += 1
            current.add(e)
        with_samples = {ds.episode_of(i) for i in range(len(ds))}
        assert set(episodes) == with_samples
        assert n_blocks + 1 >= -(-len(with_samples) // group_size)
        # order within the run is shuffled, not step-sorted
        assert episodes != sorted(episodes)


def test_sampler_shuffles_within_a_group(many):
    ds = SequenceDataset(many, sequence_length=1, skip_intro=0, cache_episodes=2)
    order = list(EpisodeGroupedSampler(ds, group_size=2, seed=0))
    steps = [int(ds.index[i, 1]) for i in order]
    assert steps != sorted(steps)
    # items of the first group's episodes are interleaved, not one episode after the other
    first_two = [ds.episode_of(i) for i in order[:20]]
    assert _runs(first_two) > 2


def test_sampler_group_size_defaults_to_cache_and_cannot_exceed_it(many):
    ds = SequenceDataset(many, sequence_length=1, skip_intro=0, cache_episodes=3)
    assert EpisodeGroupedSampler(ds).group_size == 3
    with pytest.raises(DatasetError, match="group_size 4 exceeds the dataset's cache_episodes 3"):
        EpisodeGroupedSampler(ds, group_size=4)


def test_every_episode_is_decoded_once_into_the_frame_store(many, monkeypatch):
    loads = _count_frame_loads(monkeypatch)
    ds = SequenceDataset(many, sequence_length=2, skip_intro=0)
    for epoch in range(2):
        sampler = EpisodeGroupedSampler(ds, seed=5)
        sampler.set_epoch(epoch)
        for batch in batch_loader(ds, 16, sampler):
            assert batch["frames"].dtype == torch.uint8
    with_samples = {ds.episodes[ds.episode_of(i)].sidecar_path.stem for i in range(len(ds))}
    assert set(loads) == with_samples and set(loads.values()) == {1}
    again = SequenceDataset(many, sequence_length=2, skip_intro=0)  # a new run: the cached files are read
    for item in range(len(again)):
        again[item]
    assert set(loads.values()) == {1}
    assert len(list((many / ".frames").glob("*.npy"))) == len(with_samples)
    assert not list((many / ".frames").glob("*.partial"))


def test_a_changed_episode_is_decoded_again(tmp_path):
    write_synthetic(tmp_path, "ep", 20, track_seed=0, episode=3, textured=False)
    first = SequenceDataset(tmp_path, sequence_length=1, skip_intro=0)[5]["frames"]
    write_synthetic(tmp_path, "ep", 20, track_seed=0, episode=7, textured=False)  # same name, new pixels
    second = SequenceDataset(tmp_path, sequence_length=1, skip_intro=0)[5]["frames"]
    assert int(first[0, 2, 0, 0]) == 3 and int(second[0, 2, 0, 0]) == 7


def test_a_read_only_dataset_caches_its_frames_elsewhere(tmp_path, monkeypatch):
    data, cache = tmp_path / "data", tmp_path / "cache"
    write_synthetic(data, "ep", 20, track_seed=0, episode=2, textured=False)
    monkeypatch.setenv("NSACDRIVE_FRAME_CACHE", str(cache))
    (data / ".frames").write_text("not a folder")  # the dataset folder cannot hold the cache
    sample = SequenceDataset(data, sequence_length=2, skip_intro=0)[4]
    np.testing.assert_array_equal(preprocessed_marker(sample["frames"].numpy()), [4, 5])
    assert len(list(cache.glob("*.npy"))) == 1


def test_batches_equal_their_samples_stacked(small):
    root, _ = small
    ds = SequenceDataset(root, sequence_length=3, frame_stride=2, skip_intro=0)
    items = [40, 0, 77, 3, 12, 41]
    batch = ds.__getitems__(items)
    rows = {(int(e), int(t)): row for row, (e, t) in enumerate(zip(batch["episode"], batch["step"], strict=True))}
    assert len(rows) == len(items)
    for item in items:
        sample = ds[item]
        row = rows[int(sample["episode"]), int(sample["step"])]
        for key, value in sample.items():
            assert torch.equal(batch[key][row], value), key
    # rows come grouped by episode, in the sampler's order within each
    assert batch["episode"].tolist() == sorted(batch["episode"].tolist())
    assert [int(t) for e, t in zip(batch["episode"], batch["step"]) if int(e) == ds.episode_of(40)] == \
        [int(ds.index[i, 1]) for i in items if ds.episode_of(i) == ds.episode_of(40)]


# --------------------------------------------------------------------------- LRU raw-frame cache (augmented or corrupted samples)


def _first_item_of(ds: SequenceDataset, episode: int) -> int:
    return int(np.flatnonzero(ds.index[:, 0] == episode)[0])


def test_grouped_sampling_decodes_every_raw_episode_once(many, monkeypatch):
    ds = SequenceDataset(many, sequence_length=2, skip_intro=0, cache_episodes=3, corruption=unchanged)
    loads = _count_frame_loads(monkeypatch)
    for item in EpisodeGroupedSampler(ds, seed=5):
        ds[item]
        assert len(ds._cache) <= 3
    with_samples = {ds.episodes[ds.episode_of(i)].sidecar_path.stem for i in range(len(ds))}
    assert set(loads) == with_samples and set(loads.values()) == {1}


def test_lru_cache_evicts_least_recently_used(small, monkeypatch):
    root, _ = small
    ds = SequenceDataset(root, sequence_length=1, skip_intro=0, cache_episodes=2, corruption=unchanged)
    loads = _count_frame_loads(monkeypatch)
    for episode in (0, 1, 0, 2):
        ds[_first_item_of(ds, episode)]
    assert list(ds._cache) == [0, 2]  # 1 was least recently used
    assert loads == {"ep00": 1, "ep01": 1, "ep02": 1}
    ds[_first_item_of(ds, 1)]  # reloaded, evicts 0
    assert list(ds._cache) == [2, 1]
    assert loads["ep01"] == 2


def test_cache_never_exceeds_its_size_and_returns_the_right_frames(small):
    root, _ = small
    ds = SequenceDataset(root, sequence_length=2, skip_intro=0, cache_episodes=3, corruption=unchanged)
    plain = SequenceDataset(root, sequence_length=2, skip_intro=0)
    rng = np.random.default_rng(0)
    for item in rng.integers(0, len(ds), 300):
        sample = ds[int(item)]
        assert len(ds._cache) <= 3
        e, t = int(sample["episode"]), int(sample["step"])
        np.testing.assert_array_equal(preprocessed_marker(sample["frames"].numpy()), [t - 1, t])
        assert np.all(sample["frames"][:, 2, 0, 0].numpy() == e)
        assert torch.equal(sample["frames"], plain[int(item)]["frames"])  # both paths give the same frames


def test_bounded_memory_with_dataloader_and_grouped_sampler(tmp_path):
    # 40 episodes × 201 frames: 194 MB of encoded frames. They are memory-mapped files, so the
    # operating system may keep them as page cache (file-backed, shared, evicted under pressure);
    # what the process itself allocates (anonymous memory) must stay small.
    n_episodes, n_steps = 40, 200
    for i in range(n_episodes):
        write_synthetic(tmp_path, f"ep{i:03d}", n_steps, track_seed=i, episode=i, textured=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # OMP threads spin badly when xdist keeps every core busy
    try:
        ds = SequenceDataset(tmp_path, sequence_length=4, skip_intro=100, cache_episodes=4)
        loader = batch_loader(ds, 32, EpisodeGroupedSampler(ds, seed=0))
        gc.collect()
        process = psutil.Process()

        def anonymous() -> int:
            info = process.memory_info()
            return info.rss - info.shared

        baseline = peak = anonymous()
        seen = 0
        for batch in loader:
            seen += len(batch["step"])
            peak = max(peak, anonymous())
    finally:
        torch.set_num_threads(threads)
    assert seen == len(ds) == n_episodes * (n_steps - 103)
    assert not ds._cache  # no decoded episode is held: the frame store serves every sample
    # one episode is decoded at a time (~11 MB raw) while its file is written
    assert (peak - baseline) / 2**20 < 100


# --------------------------------------------------------------------------- errors while indexing


@pytest.fixture
def mixed(tmp_path):
    """3 good episodes (seeds 10, 11, 12) and 4 bad ones, names sorted so bad ones interleave."""
    good = {}
    for name, seed in (("a_good", 10), ("c_good", 11), ("e_good", 12)):
        _, good[name] = write_synthetic(tmp_path, name, 15, track_seed=seed, episode=seed)
    write_synthetic(tmp_path, "b_truncated", 15, track_seed=20)
    data = tmp_path / "b_truncated.npz"
    data.write_bytes(data.read_bytes()[:100])
    arrays = synthetic_arrays(15)
    arrays["actions"][3] = np.nan
    write_episode(tmp_path, "d_nan", arrays, synthetic_metadata(arrays, 21))
    (tmp_path / "f_badjson.json").write_text("{oops")
    write_synthetic(tmp_path, "g_missing", 15, track_seed=22)
    (tmp_path / "g_missing.npz").unlink()
    return tmp_path, good


def test_on_error_raise_names_the_first_bad_file(mixed):
    root, _ = mixed
    with pytest.raises(EpisodeFileError, match=r"b_truncated\.npz: file has 100 bytes"):
        SequenceDataset(root, skip_intro=0)


def test_on_error_skip_warns_and_loads_the_rest(mixed):
    root, good = mixed
    with pytest.warns(UserWarning) as record:
        ds = SequenceDataset(root, sequence_length=2, skip_intro=0, on_error="skip")
    messages = [str(w.message) for w in record if "skipping episode" in str(w.message)]
    assert len(messages) == 4
    for fragment in ("b_truncated.npz", "d_nan.npz", "f_badjson.json", "g_missing.npz"):
        assert sum(fragment in m for m in messages) == 1, fragment
    assert any("NaN" in m for m in messages)
    assert [r.sidecar_path.stem for r in ds.episodes] == ["a_good", "c_good", "e_good"]
    assert ds.track_seeds == [10, 11, 12]
    assert len(ds) == 3 * 14
    for item in (0, 14, 41):
        sample = ds[item]
        e, t = int(sample["episode"]), int(sample["step"])
        name = ds.episodes[e].sidecar_path.stem
        np.testing.assert_array_equal(sample["frames"].numpy(),
                                      encode_observation(good[name]["observations"][[t - 1, t]]))
        np.testing.assert_array_equal(sample["action"].numpy(), good[name]["expert_actions"][t])


def test_dataset_configuration_errors(small, tmp_path):
    root, _ = small
    with pytest.raises(DatasetError, match="dataset folder does not exist"):
        SequenceDataset(tmp_path / "nope")
    with pytest.raises(DatasetError, match="on_error must be 'raise' or 'skip', got 'ignore'"):
        SequenceDataset(root, on_error="ignore")  # type: ignore[arg-type]
    for kwargs in ({"sequence_length": 0}, {"frame_stride": 0}, {"skip_intro": -1}, {"cache_episodes": 0}):
        with pytest.raises(DatasetError, match="must be >= 1"):
            SequenceDataset(root, **kwargs)
    assert len(SequenceDataset(tmp_path)) == 0  # empty folder: an empty dataset


def test_manifest_and_hidden_files_are_not_episodes(small, tmp_path):
    write_synthetic(tmp_path, "only", 8, track_seed=3)
    (tmp_path / "manifest.json").write_text(json.dumps({"n_episodes": 1}))
    (tmp_path / ".only.json.x.partial").write_text("junk")
    (tmp_path / ".hidden.json").write_text("junk")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = SequenceDataset(tmp_path, sequence_length=1, skip_intro=0)
    assert [r.sidecar_path.name for r in ds.episodes] == ["only.json"]


def test_an_episode_file_without_its_sidecar_is_named_in_a_warning(tmp_path):
    write_synthetic(tmp_path, "kept", 8, track_seed=3)
    for name in ("lost_a", "lost_b"):
        write_synthetic(tmp_path, name, 8, track_seed=4)
        (tmp_path / f"{name}.json").unlink()
    with pytest.warns(UserWarning, match=r"ignoring 2 episode file\(s\) without a JSON sidecar: lost_a\.npz, lost_b\.npz$"):
        ds = SequenceDataset(tmp_path, sequence_length=1, skip_intro=0)
    assert [r.sidecar_path.name for r in ds.episodes] == ["kept.json"]


def test_many_orphaned_episode_files_are_counted_and_the_first_named(tmp_path):
    for k in range(5):
        write_synthetic(tmp_path, f"lost{k}", 4, track_seed=k, textured=False)
        (tmp_path / f"lost{k}.json").unlink()
    with pytest.warns(UserWarning, match=r"ignoring 5 episode file\(s\) .*: lost0\.npz, lost1\.npz, lost2\.npz and 2 more$"):
        with pytest.raises(DatasetError, match="no episodes found"):
            summarize(tmp_path)


def test_an_episode_file_named_by_another_sidecar_or_by_an_unreadable_one_is_no_orphan(tmp_path):
    write_synthetic(tmp_path, "one", 8, track_seed=3)
    (tmp_path / "one.npz").rename(tmp_path / "renamed.npz")
    sidecar = json.loads((tmp_path / "one.json").read_text())
    (tmp_path / "one.json").write_text(json.dumps({**sidecar, "file": "renamed.npz"}))
    (tmp_path / "broken.npz").write_bytes(b"x")
    (tmp_path / "broken.json").write_text("{oops")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = SequenceDataset(tmp_path, sequence_length=1, skip_intro=0, on_error="skip")
    assert [r.sidecar_path.name for r in ds.episodes] == ["one.json"]
    assert not [w for w in caught if "without a JSON sidecar" in str(w.message)]


# --------------------------------------------------------------------------- summarize


SUMMARY_EPISODES = [
    # id, n_steps, seed, preset, lap_finished, termination, source, agent_spec
    ("s0", 10, 0, "default", True, "lap_finished", "expert", "expert"),
    ("s1", 20, 1, "default", False, "time_limit", "expert", "expert"),
    ("s2", 15, 2, "default", True, "lap_finished", "expert", "expert"),
    ("s3", 5, 2, "shift-1", False, "left_playfield", "ppo", "ppo:run1"),
    ("s4", 30, 5, "shift-1", False, "time_limit", "expert", "expert"),
]


@pytest.fixture(scope="module")
def summary_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("summary")
    arrays = []
    for i, (name, n, seed, preset, lap, reason, source, spec) in enumerate(SUMMARY_EPISODES):
        _, a = write_synthetic(root, name, n, track_seed=seed, episode=i, textured=False, colour_preset=preset,
                               lap_finished=lap, termination_reason=reason, source=source, agent_spec=spec)
        arrays.append(a)
    return root, arrays


def test_summarize_counts_and_statistics(summary_set):
    root, arrays = summary_set
    s = summarize(root)
    assert s.root == str(root)
    assert s.episodes == 5
    assert s.frames == 80
    assert s.seeds == [0, 1, 2, 5]
    assert s.sources == {"expert": 4, "ppo": 1}
    assert s.agents == {"expert": 4, "ppo:run1": 1}
    assert s.colour_presets == {"default": 3, "shift-1": 2}
    assert s.lap_finished_rate == pytest.approx(0.4)
    assert s.termination_reasons == {"lap_finished": 2, "time_limit": 2, "left_playfield": 1}
    rewards = np.array([np.sum(a["rewards"], dtype=np.float64) for a in arrays])
    assert s.reward_mean == pytest.approx(rewards.mean(), rel=1e-9)
    assert s.reward_std == pytest.approx(rewards.std(), rel=1e-9)
    for kind, key in (("executed", "actions"), ("label", "expert_actions")):
        values = np.concatenate([a[key] for a in arrays]).astype(np.float64)
        assert values.shape == (80, 3)
        for i, name in enumerate(ACTION_NAMES):
            stats = s.action_stats[kind][name]
            assert stats["mean"] == pytest.approx(values[:, i].mean(), rel=1e-5)
            assert stats["std"] == pytest.approx(values[:, i].std(), rel=1e-5)
            assert stats["min"] == values[:, i].min()
            assert stats["max"] == values[:, i].max()
    assert s.action_stats["executed"]["steer"] != s.action_stats["label"]["steer"]


def test_summary_dict_and_text(summary_set):
    root, _ = summary_set
    s = summarize(root)
    as_dict = json.loads(json.dumps(s.to_dict()))
    assert as_dict["seeds"] == "0-2,5"
    assert as_dict["episodes"] == 5 and as_dict["frames"] == 80
    assert as_dict["action_stats"]["label"]["gas"]["max"] == s.action_stats["label"]["gas"]["max"]
    text = s.to_text()
    assert "episodes           5\n" in text
    assert "frames (steps)     80\n" in text
    assert "track seeds        0-2,5  (4 tracks)\n" in text
    assert "sources            expert (4), ppo (1)\n" in text
    assert "colour presets     default (3), shift-1 (2)\n" in text
    assert "lap finished       40.0%\n" in text
    assert "terminations       lap_finished (2), left_playfield (1), time_limit (2)\n" in text
    st = s.action_stats["executed"]["brake"]
    assert f"executed  brake    {st['mean']:8.3f}{st['std']:8.3f}{st['min']:8.3f}{st['max']:8.3f}" in text
    assert len([line for line in text.splitlines() if line.startswith(("executed", "label"))]) == 6


def test_summarize_errors(tmp_path):
    with pytest.raises(DatasetError, match="no episodes found"):
        summarize(tmp_path)
    with pytest.raises(DatasetError, match="does not exist"):
        summarize(tmp_path / "missing")


def test_summarize_skip_bad(mixed):
    root, _ = mixed
    with pytest.raises(EpisodeFileError, match="b_truncated.npz"):
        summarize(root)
    with pytest.warns(UserWarning, match="skipping episode"):
        s = summarize(root, on_error="skip")
    assert s.episodes == 3 and s.frames == 45 and s.seeds == [10, 11, 12]


def test_on_error_skip_survives_a_sidecar_with_a_non_integer_n_steps(tmp_path):
    write_synthetic(tmp_path, "a_good", 10, track_seed=1, textured=False)
    write_synthetic(tmp_path, "b_bad", 10, track_seed=2, textured=False)
    sidecar = json.loads((tmp_path / "b_bad.json").read_text())
    sidecar["n_steps"] = "ten"
    (tmp_path / "b_bad.json").write_text(json.dumps(sidecar))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = SequenceDataset(tmp_path, sequence_length=1, skip_intro=0, on_error="skip")
    assert ds.track_seeds == [1]
    assert any("b_bad" in str(w.message) for w in caught)
