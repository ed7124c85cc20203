"""The Udacity training path: NVIDIA encoder column tokens, every head on them, the Udacity
dataset (preprocessing + seeded augmentation), and tiny training runs on a generated recording
(`--data udacity:DIR`), evaluated offline and driven by the closed-loop agent."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from data_fixtures import normalize, write_synthetic
from float_paths import UNIT_ROUNDOFF, assert_paths_agree, path_rtol
from safetensors.torch import load_file
from typer.testing import CliRunner
from udacity_fixtures import write_recording

import nsacdrive.data_collection.udacity_import as udacity_import
from nsacdrive.cli import app
from nsacdrive.controllers.checkpoint import LAST_WEIGHTS, latest_checkpoint
from nsacdrive.controllers.encoders import EncoderConfig, NvidiaEncoder, make_encoder
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.registry import MODEL_BUILDERS, build_controller
from nsacdrive.controllers.run import load_run
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.training import Trainer
from nsacdrive.controllers.udacity_augment import UdacityAugmentConfig, augment_sequence
from nsacdrive.data_collection.dataset import SequenceDataset, network_frames
from nsacdrive.data_collection.episode import load_episode_arrays
from nsacdrive.data_collection.errors import DatasetError
from nsacdrive.data_collection.manifest import sidecar_paths
from nsacdrive.envs.udacity_observation import UDACITY_CROP_ROWS, preprocess_udacity
from nsacdrive.eval.closed_loop import DriveConfig, EpisodeDrive, EpisodeKey
from nsacdrive.eval.driver import ControllerAgent, ControllerInterface
from nsacdrive.eval.explain.saliency import GradCamUnavailable, gradcam_layer
from nsacdrive.eval.offline import evaluate_run

ALL_MODELS = sorted(set(MODEL_BUILDERS) | {"ensemble"})
CONFIG_FILE = Path(__file__).resolve().parents[1] / "configs" / "udacity.json"


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(name: str, **overrides) -> ModelConfig:
    base = dict(model=name, observation="udacity", encoder=EncoderConfig(kind="nvidia", token_dim=16), d_model=16,
                num_heads=4, topk=8, train_samples=3, predict_samples=4, members=2, sde_depth=3, levy_frames=3)
    return ModelConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A 40-row recording: with episodes of 8 steps its udacity: cache holds 4 episodes (seeds 0-3)."""
    return write_recording(tmp_path_factory.mktemp("udacity") / "rec", rows=40, header=True, paths="foreign", seed=1)


@pytest.fixture
def short_episodes(monkeypatch):
    monkeypatch.setattr(udacity_import, "DEFAULT_EPISODE_LENGTH", 8)


# --------------------------------------------------------------------------- encoder and heads


def test_nvidia_encoder_emits_18_column_tokens_per_frame():
    torch.manual_seed(0)
    encoder = NvidiaEncoder()
    frames = torch.randn(2, 3, 3, 66, 200)
    tokens = encoder(frames)
    assert tokens.shape == (2, 3 * 18, 64)
    maps = encoder.features(frames.flatten(0, 1))
    assert maps.shape == (6, 64, 1, 18) and encoder.last_conv is encoder.features[8]
    # token t·18 + k is column k of frame t's map (a spatial column, not a memory reshape) plus column k's position
    position = encoder.to_token[-1].position
    for frame in (0, 2):
        for column in (0, 7, 17):
            torch.testing.assert_close(tokens[1, frame * 18 + column], maps[3 + frame, :, 0, column] + position[column])


def test_nvidia_column_tokens_tell_left_from_right_in_an_unordered_set():
    """The same column content at two places gives two different tokens (heads pool tokens as a set)."""
    encoder = NvidiaEncoder()
    maps = torch.ones(1, 64, 1, 18)
    tokens = encoder.to_token(maps)[0]  # identical columns
    assert not torch.allclose(tokens[0], tokens[17])
    torch.testing.assert_close(tokens - encoder.to_token[-1].position, torch.ones(18, 64))


def test_nvidia_encoder_projects_tokens_and_encodes_frames_independently():
    torch.manual_seed(0)
    encoder = make_encoder(EncoderConfig(kind="nvidia", token_dim=16))
    frames = torch.randn(1, 2, 3, 66, 200)
    tokens = encoder(frames)
    assert tokens.shape == (1, 36, 16)
    changed = frames.clone()
    changed[:, 1] += 1
    torch.testing.assert_close(encoder(changed)[:, :18], tokens[:, :18])
    assert not torch.allclose(encoder(changed)[:, 18:], tokens[:, 18:])
    with pytest.raises(ValueError, match=r"frames must have shape \[B, T, 3, 66, 200\]"):
        encoder(torch.zeros(1, 2, 3, 84, 96))


def test_nvidia_encoder_channels_last_frames_give_the_default_layouts_tokens_and_gradients():
    """The layout is a speed choice only: tokens and weight gradients agree with the default (NCHW)
    layout to the float32 tolerance of the encoder's reduction lengths."""
    torch.manual_seed(0)
    fast = NvidiaEncoder(EncoderConfig(kind="nvidia", token_dim=16))
    plain = NvidiaEncoder(EncoderConfig(kind="nvidia", token_dim=16))
    plain.load_state_dict(fast.state_dict())
    plain.CHANNELS_LAST = False
    assert fast.CHANNELS_LAST
    frames = torch.randn(3, 2, 3, 66, 200)
    rtol = path_rtol(fast)
    tokens_fast, tokens_plain = fast(frames), plain(frames)
    assert_paths_agree(tokens_fast, tokens_plain, rtol, "tokens")
    tokens_fast.square().sum().backward()
    tokens_plain.square().sum().backward()
    first_fast, first_plain = fast.features[0].weight, plain.features[0].weight
    assert first_fast.is_contiguous()  # only the frames change layout: the saved weights stay NCHW
    positions = fast.features[0](frames.flatten(0, 1))[:, 0].numel()  # the weight gradient sums over every output cell (N·H·W)
    assert_paths_agree(first_fast.grad, first_plain.grad, 2 * rtol + UNIT_ROUNDOFF * positions, "first convolution's gradient")


def test_model_config_pairs_observation_and_encoder():
    assert ModelConfig(observation="udacity").encoder.kind == "nvidia"
    assert ModelConfig().encoder.kind == "cnn" and ModelConfig().observation == "carracing"
    with pytest.raises(ValueError, match="encoder kind 'cnn' reads frames \\(3, 84, 96\\), but observation 'udacity'"):
        ModelConfig(observation="udacity", encoder=EncoderConfig(kind="cnn"))
    with pytest.raises(ValueError, match="encoder kind 'nvidia' reads frames \\(3, 66, 200\\), but observation 'carracing'"):
        ModelConfig(encoder=EncoderConfig(kind="nvidia"))
    with pytest.raises(ValueError, match="model config 'observation': unknown observation kind 'carla'"):
        ModelConfig(observation="carla")
    config = tiny_model("nsac")
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_a_front_camera_controller_drives_with_the_camera_it_was_trained_on():
    """``camera_fov``: the simulator's 65° unless named, only for front cameras; closed-loop episodes
    are driven in an env whose camera has the controller's field of view."""
    assert (ModelConfig().camera_fov, ModelConfig(observation="udacity").camera_fov) == (None, 65.0)
    saved = ModelConfig(observation="udacity").to_dict()
    del saved["camera_fov"]  # a run saved before the field existed drove the default camera
    assert ModelConfig.from_dict(saved).camera_fov == 65.0
    with pytest.raises(ValueError, match="model config 'camera_fov': only observation 'udacity' has a front camera"):
        ModelConfig(camera_fov=90.0)
    with pytest.raises(ValueError, match=r"model config camera_fov must be in \[10.0, 150.0\], got 200"):
        ModelConfig(observation="udacity", camera_fov=200)
    key = EpisodeKey(run="r", colour_preset="default", track_seed=3, repeat=0)
    frames = {}
    for fov in (65.0, 90.0):
        episode = EpisodeDrive(key, DriveConfig(max_steps=5), ControllerInterface("gmle", "udacity", False, 3, fov))
        assert episode.env.unwrapped.camera.config.horizontal_fov == fov
        frames[fov] = episode.observation
        episode.env.close()
    assert frames[65.0].shape == frames[90.0].shape and not np.array_equal(frames[65.0], frames[90.0])


@pytest.mark.parametrize("model", ALL_MODELS)
def test_every_head_trains_and_predicts_on_column_tokens(model):
    torch.manual_seed(0)
    controller = build_controller(tiny_model(model, speed_input=True))
    frames, timestamps = torch.randn(2, 3, 3, 66, 200), torch.tensor([[-0.04, -0.02, 0.0]] * 2)
    speed, target = torch.rand(2, 3) * 30, torch.tensor([[0.1, 0.5, 0.0], [-0.2, 0.1, 0.3]])
    terms = controller.training_loss(frames, timestamps, target, perturb=lambda f: f + 0.1, speed=speed)
    terms["total"].backward()
    assert torch.isfinite(terms["total"])
    controller.eval()
    prediction = controller.predict(frames, timestamps, samples=3, speed=speed)
    assert prediction.mean.shape == (2, 3) and torch.all(prediction.aleatoric > 0)
    if prediction.attention is not None:  # NSAC: attention summed back to one weight per frame
        assert prediction.attention.shape == (2, 3)
        torch.testing.assert_close(prediction.attention.sum(1), torch.ones(2))


def test_speed_is_given_per_frame_and_repeated_per_token():
    controller = build_controller(tiny_model("gmle", speed_input=True))
    with pytest.raises(ValueError, match=r"pass speed of shape \(1, 2\) \(one per frame\), got \(1, 36\)"):
        controller.tokens(torch.zeros(1, 2, 3, 66, 200), torch.zeros(1, 36))
    torch.testing.assert_close(controller.token_times(torch.tensor([[-0.02, 0.0]])),
                               torch.tensor([[0.98] * 18 + [1.0] * 18]))


def test_grad_cam_refuses_the_column_strip_clearly():
    with pytest.raises(GradCamUnavailable, match="NvidiaEncoder is 1×18: too coarse for Grad-CAM"):
        gradcam_layer(build_controller(tiny_model("nsac")))


# --------------------------------------------------------------------------- dataset


def test_udacity_dataset_preprocesses_the_centre_camera(recording, short_episodes):
    dataset = SequenceDataset(f"udacity:{recording.folder}", [1], sequence_length=3, observation="udacity")
    assert len(dataset) == 6  # 8 steps, sequences end at steps 2..7, no intro skipped
    sample = dataset[0]
    assert sample["frames"].shape == (3, 3, 66, 200) and sample["frames"].dtype == torch.uint8
    rows = [8 + step for step in (0, 1, 2)]  # episode 1 starts at row 8
    expected = preprocess_udacity(np.stack([recording.rgb("center", r) for r in rows]))
    np.testing.assert_array_equal(network_frames(sample["frames"], dataset.kind).numpy(), expected)
    np.testing.assert_allclose(sample["action"].numpy(), recording.actions[10], atol=1e-6)
    np.testing.assert_allclose(sample["speed"].numpy(), recording.speed[rows], atol=1e-4)


def test_udacity_augmentation_is_seeded_per_sample_and_moves_labels(recording, short_episodes):
    augment = functools.partial(augment_sequence, config=UdacityAugmentConfig(probability=0.6))
    dataset = SequenceDataset(f"udacity:{recording.folder}", [0, 1], sequence_length=3, observation="udacity", augment=augment)
    dataset.reseed(11)
    first = [dataset[i] for i in range(len(dataset))]
    again = [dataset[i] for i in range(len(dataset))]
    for a, b in zip(first, again):
        torch.testing.assert_close(a["frames"], b["frames"])
        torch.testing.assert_close(a["action"], b["action"])
    raw = SequenceDataset(f"udacity:{recording.folder}", [0, 1], sequence_length=3, observation="udacity")
    moved = [abs(float(a["action"][0] - raw[i]["action"][0])) > 1e-6 for i, a in enumerate(first)]
    assert 0 < sum(moved) < len(moved)
    for i, a in enumerate(first):
        torch.testing.assert_close(a["action"][1:], raw[i]["action"][1:])  # throttle and brake untouched
    dataset.reseed(12)
    assert any(not torch.equal(dataset[i]["frames"], first[i]["frames"]) for i in range(len(dataset)))


@pytest.mark.parametrize("threads", [1, 2])
def test_an_augmented_batch_is_its_samples_gathered_one_by_one(recording, short_episodes, threads):
    """The batch path spreads its samples over torch's threads; each sample is seeded by its index,
    so the batch is its samples, in order, however many threads gathered it."""
    augment = functools.partial(augment_sequence, config=UdacityAugmentConfig(probability=0.8), rows=UDACITY_CROP_ROWS)
    dataset = SequenceDataset(f"udacity:{recording.folder}", [0, 1], sequence_length=3, observation="udacity", augment=augment,
                              cache_episodes=1)  # a batch over two episodes: the cache holds one
    dataset.reseed(5)
    items = [7, 0, 3, 9, 1, 11]  # both episodes, out of order
    alone = [dataset[i] for i in items]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        batch = dataset.__getitems__(items)
    finally:
        torch.set_num_threads(before)
    order = sorted(range(len(items)), key=lambda k: dataset.episode_of(items[k]))  # the batch groups rows by episode
    for row, k in enumerate(order):
        for key in ("frames", "action", "action_sequence", "speed"):
            torch.testing.assert_close(batch[key][row], alone[k][key], rtol=0, atol=0)


def test_frame_kind_must_match_the_observation(recording, short_episodes, tmp_path):
    with pytest.raises(DatasetError, match="holds udacity frames, but this dataset reads carracing observations"):
        SequenceDataset(f"udacity:{recording.folder}", [0])
    write_synthetic(tmp_path, "car", 5, track_seed=0)
    with pytest.raises(DatasetError, match="holds carracing frames, but this dataset reads udacity observations"):
        SequenceDataset(tmp_path, observation="udacity")


# --------------------------------------------------------------------------- training runs


def tiny_config(recording, name: str, **overrides) -> TrainConfig:
    base = dict(data=f"udacity:{recording.folder}", model=tiny_model(name), sequence_length=3, frame_stride=1,
                batch_size=4, epochs=1, max_batches_per_epoch=2, max_val_batches=1, seed=2, device="cpu")
    return TrainConfig(**{**base, **overrides})


def test_cli_trains_nsac_on_a_raw_recording_with_the_udacity_config(recording, short_episodes, tmp_path):
    out = tmp_path / "nsac"
    result = CliRunner().invoke(app, ["train", "--data", f"udacity:{recording.folder}", "--config", str(CONFIG_FILE),
                                      "--out", str(out), "--epochs", "1", "--max-batches-per-epoch", "2", "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    assert "trained nsac for 1 epochs" in normalize(result.output)
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["observation"] == "udacity" and config["model"]["encoder"]["kind"] == "nvidia"
    # the automatic split holds out the last episodes of the drive: seeds 0-1 train, 2 val, 3 test
    assert (config["train_seeds"], config["val_seeds"], config["test_seeds"]) == ("0-1", "2", "3")
    assert (recording.folder / ".nsacdrive-import" / "manifest.json").exists()
    assert all(torch.isfinite(w).all() for w in load_file(out / "model.safetensors").values())


@pytest.mark.parametrize("model", ["gmle", "levy"])
def test_tiny_training_is_seeded_and_evaluates_offline(recording, short_episodes, tmp_path, model):
    config = tiny_config(recording, model)
    Trainer(config, tmp_path / "a", progress=False).fit()
    Trainer(config, tmp_path / "b", progress=False).fit()
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)  # augmentation included: same seed, same weights
    result = evaluate_run(tmp_path / "a", f"udacity:{recording.folder}", split="test")
    report = result["conditions"]["clean"]
    assert report["samples"] == 13 and np.isfinite(report["per_action"]["steer"]["mse"])


def test_augmented_batches_gathered_ahead_on_a_thread_give_the_same_weights(recording, short_episodes, tmp_path):
    """``Trainer.prefetch`` (a GPU run's default) with raw-frame augmentation: every sample is seeded
    by its index, so gathering the batches on the prefetch thread trains the same weights."""
    weights = {}
    for prefetch in (False, True):
        trainer = Trainer(tiny_config(recording, "gmle", epochs=2, max_batches_per_epoch=3), tmp_path / str(prefetch), progress=False)
        trainer.prefetch = prefetch
        trainer.fit()
        weights[prefetch] = load_file(latest_checkpoint(tmp_path / str(prefetch)).path(LAST_WEIGHTS))
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in weights[False])


def test_prefix_sets_the_observation_and_refuses_a_contradiction(recording):
    config = TrainConfig.from_dict({"data": f"udacity:{recording.folder}", "model": {"model": "gmle"}})
    assert config.model.observation == "udacity" and config.model.encoder.kind == "nvidia"
    with pytest.raises(ValueError, match="is Udacity data, but model.observation is 'carracing'"):
        TrainConfig(data=f"udacity:{recording.folder}", model=ModelConfig(model="gmle"))


def test_closed_loop_agent_matches_the_dataset_path(recording, short_episodes, tmp_path):
    run = tmp_path / "gmle"
    Trainer(tiny_config(recording, "gmle", model=tiny_model("gmle", speed_input=True)), run, progress=False).fit()
    model, config = load_run(run)
    dataset = SequenceDataset(f"udacity:{recording.folder}", [3], sequence_length=3, frame_stride=1, observation="udacity")
    _, arrays = load_episode_arrays(sidecar_paths(recording.folder / ".nsacdrive-import")[3])
    agent = ControllerAgent(run)
    agent.reset()
    for step in range(5):
        online = agent.predict(arrays["observations"][step], float(arrays["speed"][step]))
    sample = dataset[2]  # the sequence ending at step 4
    assert int(sample["step"]) == 4
    offline = model.predict(network_frames(sample["frames"][None], dataset.kind), sample["timestamps"][None],
                            samples=config.model.predict_samples,
                            speed=sample["speed"][None])
    torch.testing.assert_close(online.mean, offline.mean, rtol=1e-5, atol=1e-6)
    assert dataclasses.asdict(config.model)["observation"] == "udacity"
