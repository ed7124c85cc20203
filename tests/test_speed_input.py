"""Controllers that read the measured speed: data, training, prediction and the closed-loop cache agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from float_paths import assert_paths_agree, path_rtol

from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.registry import build_controller
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.training import Trainer
from nsacdrive.data_collection.dataset import SequenceDataset, load_episode_records
from nsacdrive.data_collection.recorder import CollectConfig, collect
from nsacdrive.envs.observation import preprocess_observation

TINY = dict(encoder=EncoderConfig(token_dim=16, channels=(8, 16, 16)), d_model=16, num_heads=4, topk=4, speed_input=True)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("speed")
    collect(CollectConfig(agent="expert", seeds=[0, 1, 2], max_steps=80), folder, progress=False)
    return folder


def test_samples_carry_the_speed_of_each_frame(dataset_dir):
    data = SequenceDataset(dataset_dir, sequence_length=4, frame_stride=2, skip_intro=0)
    record = load_episode_records(dataset_dir, None, "raise")[data.episode_of(30)]
    sample, step = data[30], int(data.index[30, 1])
    expected = np.load(record.sidecar_path.with_suffix(".npz"))["speed"][step - 6 : step + 1 : 2]
    np.testing.assert_allclose(sample["speed"].numpy(), expected)
    assert sample["speed"].dtype == torch.float32 and sample["speed"].shape == (4,)


@pytest.mark.parametrize("model", ["nsac", "gmle", "ensemble"])
def test_speed_changes_the_prediction_and_is_required(model):
    torch.manual_seed(0)
    controller = build_controller(ModelConfig(model=model, members=2, **TINY)).eval()
    frames, times = torch.rand(2, 4, 3, 84, 96), torch.zeros(2, 4)
    with pytest.raises(ValueError, match="measured speed"):
        controller.predict(frames, times, samples=2)
    torch.manual_seed(1)
    slow = controller.predict(frames, times, samples=2, speed=torch.zeros(2, 4))
    torch.manual_seed(1)
    fast = controller.predict(frames, times, samples=2, speed=torch.full((2, 4), 80.0))
    assert not torch.allclose(slow.mean, fast.mean)


def test_speed_embedding_is_trained(dataset_dir, tmp_path):
    config = TrainConfig(data=str(dataset_dir), model=ModelConfig(model="gmle", **TINY), train_seeds="0", val_seeds="1",
                         test_seeds="2", batch_size=8, epochs=1, max_batches_per_epoch=2, max_val_batches=1)
    trainer = Trainer(config, tmp_path / "run", progress=False)
    before = trainer.model.speed_embedding.weight.detach().clone()
    trainer.fit()
    assert not torch.equal(before, trainer.model.speed_embedding.weight.detach())


def test_closed_loop_agent_feeds_the_speed_and_its_cache_matches_re_encoding(dataset_dir, tmp_path):
    from nsacdrive.eval.driver import ControllerAgent

    config = TrainConfig(data=str(dataset_dir), model=ModelConfig(model="gmle", **TINY), train_seeds="0", val_seeds="1",
                         test_seeds="2", batch_size=8, epochs=1, max_batches_per_epoch=1, max_val_batches=1)
    Trainer(config, tmp_path / "run", progress=False).fit()
    agent = ControllerAgent(tmp_path / "run")
    rng = np.random.default_rng(0)
    speeds = []
    for step in range(10):
        speeds.append(float(rng.uniform(0, 90)))
        cached = agent.predict(rng.integers(0, 256, size=(96, 96, 3), dtype=np.uint8), speeds[-1])
        indices = agent.history_indices()
        frames = torch.from_numpy(preprocess_observation(agent.sequence()))[None]
        history = speeds[-len(agent.frames):]
        full = agent.model.predict(frames, agent.timestamps, samples=1, speed=torch.tensor([[history[i] for i in indices]]))
        assert_paths_agree(cached.mean, full.mean, path_rtol(agent.model, frames.shape[1]), f"step {step}")


def test_grad_cam_explains_speed_input_controllers_with_their_speeds():
    from nsacdrive.eval.explain.saliency import SaliencyConfig, SaliencyInputs, grad_cam

    torch.manual_seed(0)
    controller = build_controller(ModelConfig(model="gmle", **TINY)).eval()
    sequences = np.random.default_rng(0).integers(0, 256, size=(2, 4, 96, 96, 3), dtype=np.uint8)
    timestamps = np.array([-0.12, -0.08, -0.04, 0.0], dtype=np.float32)
    slow = grad_cam(controller, SaliencyInputs.from_sequences(sequences, timestamps, np.zeros((2, 4))), SaliencyConfig(samples=1))
    fast = grad_cam(controller, SaliencyInputs.from_sequences(sequences, timestamps, np.full((2, 4), 80.0)), SaliencyConfig(samples=1))
    assert slow.maps.shape[:2] == (2, 4) and slow.maps.shape[2:] == (84, 96)
    assert not np.allclose(slow.outputs, fast.outputs)  # the speed reaches the explained outputs
