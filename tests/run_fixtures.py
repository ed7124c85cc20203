"""Tiny trained runs for the closed-loop, DAgger, backend, plot and report tests (a plain module).

:func:`tiny_run` records a few short expert episodes and trains a deliberately tiny controller
on them for one or two batches: enough for a real run folder (config, weights, history) that
every evaluation path can load and drive, at a fraction of a second per step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.training import Trainer
from nsacdrive.data_collection.recorder import CollectConfig, collect
from nsacdrive.envs.observation_kinds import observation_kind

TINY_MODEL: dict[str, Any] = dict(encoder=EncoderConfig(token_dim=16, channels=(8, 16, 16)), d_model=16, num_heads=4, topk=4)


def tiny_run(folder: Path, model: str = "gmle", seeds: tuple[int, ...] = (0, 1, 2), split: tuple[str, str, str] = ("0", "1", "2"),
             batches: int = 1, observation: str = "carracing", **model_options: Any) -> Path:
    """Collect 80-step expert episodes on ``seeds`` into ``folder/data`` and train ``folder/run``.

    ``observation``: the camera (``udacity``: the front-camera simulator, read by the NVIDIA encoder;
    ``camera_fov`` among ``model_options`` records and trains with a camera of that field of view)."""
    kind = observation_kind(observation)
    encoder = EncoderConfig(kind=kind.default_encoder, token_dim=16, channels=TINY_MODEL["encoder"].channels)
    model_config = ModelConfig(model=model, observation=observation, **{**TINY_MODEL, "encoder": encoder, **model_options})
    camera = {} if model_config.camera_fov is None else {"camera_fov": model_config.camera_fov}
    collect(CollectConfig(agent="expert", seeds=list(seeds), max_steps=80, env=kind.env, **camera), folder / "data", progress=False)
    config = TrainConfig(data=str(folder / "data"), model=model_config,
                         train_seeds=split[0], val_seeds=split[1], test_seeds=split[2], batch_size=8, epochs=1,
                         max_batches_per_epoch=batches, max_val_batches=1)
    Trainer(config, folder / "run", progress=False).fit()
    return folder / "run"
