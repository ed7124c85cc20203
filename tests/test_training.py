"""Training runs end to end for every model; resume is exact; checkpoints are validated; the
closed-loop driving path gives the same predictions as the dataset path."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from float_paths import assert_predictions_agree, path_rtol
from safetensors.torch import load_file

import nsacdrive.controllers.precision as precision
import nsacdrive.controllers.training as training
from nsacdrive.common.prefetch import prefetched
from nsacdrive.controllers.checkpoint import LAST_WEIGHTS, CheckpointError, latest_checkpoint
from nsacdrive.controllers.encoders import EncoderConfig
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.precision import slow_precision
from nsacdrive.controllers.registry import MODEL_BUILDERS
from nsacdrive.controllers.run import load_run
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.training import Trainer
from nsacdrive.data_collection.dataset import SequenceDataset, network_frames
from nsacdrive.data_collection.episode import load_episode_arrays
from nsacdrive.data_collection.recorder import CollectConfig, collect
from nsacdrive.eval.driver import ControllerAgent

TINY_ENCODER = EncoderConfig(token_dim=16, channels=(8, 16, 16))
ALL_MODELS = sorted(set(MODEL_BUILDERS) | {"ensemble"})


def tiny_model(name: str) -> ModelConfig:
    return ModelConfig(model=name, encoder=TINY_ENCODER, d_model=16, num_heads=4, topk=4, train_samples=3,
                       predict_samples=4, members=2, sde_depth=3)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Expert episodes of 110 steps (seeds 0, 1, 2; seed 2 also as shift-3): 54 sequences each after the intro."""
    folder = tmp_path_factory.mktemp("demos")
    collect(CollectConfig(agent="expert", seeds=[0, 1, 2], max_steps=110), folder, progress=False)
    collect(CollectConfig(agent="expert", seeds=[2], colour_presets=["shift-3"], max_steps=110), folder, progress=False)  # the test track, recoloured
    return folder


def tiny_config(dataset, model: str, **overrides) -> TrainConfig:
    base = dict(data=str(dataset), model=tiny_model(model), train_seeds="0", val_seeds="1", test_seeds="2",
                batch_size=8, epochs=1, max_batches_per_epoch=2, max_val_batches=1, seed=3,
                device="cpu")  # bit-exact claims are the CPU's; tests/test_accelerator.py covers CUDA
    return TrainConfig(**{**base, **overrides})


@pytest.mark.parametrize("model", ALL_MODELS)
def test_every_model_trains_saves_and_predicts(dataset, tmp_path, model):
    state = Trainer(tiny_config(dataset, model), tmp_path / model, progress=False).fit()
    assert state.epoch == 1 and np.isfinite(state.best_val)
    controller, config = load_run(tmp_path / model)
    assert config.model.model == model
    data = SequenceDataset(dataset, [2], sequence_length=4, frame_stride=2)
    sample = data[0]
    prediction = controller.predict(network_frames(sample["frames"][None], data.kind), sample["timestamps"][None], samples=4)
    assert prediction.mean.shape == (1, 3)
    assert torch.all(prediction.mean[:, 0].abs() <= 1) and torch.all((prediction.mean[:, 1:] >= 0) & (prediction.mean[:, 1:] <= 1))
    assert torch.all(prediction.aleatoric > 0) and torch.all(prediction.epistemic >= 0)
    assert (tmp_path / model / "tensorboard").is_dir() and json.loads((tmp_path / model / "history.json").read_text())


def test_min_batches_per_epoch_repeats_a_small_training_split(dataset, tmp_path, monkeypatch):
    """Track 0's 54 sequences make 7 batches of 8; min_batches_per_epoch=20 trains 20 of them per epoch."""
    steps: list[int] = []
    original = Trainer._train_step
    monkeypatch.setattr(Trainer, "_train_step", lambda self, batch, *args: steps.append(len(batch["action"])) or original(self, batch, *args))
    Trainer(tiny_config(dataset, "gmle", max_batches_per_epoch=None), tmp_path / "one-pass", progress=False).fit()
    assert len(steps) == 7
    steps.clear()
    Trainer(tiny_config(dataset, "gmle", max_batches_per_epoch=None, min_batches_per_epoch=20), tmp_path / "repeated", progress=False).fit()
    assert len(steps) == 21  # three passes of 54 sequences: 162 samples, 20 full batches and one of 2
    assert steps[:20] == [8] * 20
    steps.clear()
    Trainer(tiny_config(dataset, "gmle", max_batches_per_epoch=5, min_batches_per_epoch=20), tmp_path / "capped", progress=False).fit()
    assert len(steps) == 5  # a time budget (max) still caps the repeated split


def test_same_seed_gives_the_same_weights(dataset, tmp_path):
    for name in ("a", "b"):
        Trainer(tiny_config(dataset, "nsac"), tmp_path / name, progress=False).fit()
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    Trainer(tiny_config(dataset, "nsac", seed=4), tmp_path / "c", progress=False).fit()
    c = load_file(tmp_path / "c" / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_batches_gathered_ahead_on_a_thread_give_the_same_weights(dataset, tmp_path, monkeypatch):
    """What a GPU run does (``Trainer.prefetch``): the same batches in the same order, so the same
    weights, as gathering each batch in turn."""
    prefetching_epochs = []
    monkeypatch.setattr(training, "prefetched", lambda items: prefetching_epochs.append(1) or prefetched(items))
    weights = {}
    for prefetch in (False, True):
        trainer = Trainer(tiny_config(dataset, "nsac", epochs=2, max_batches_per_epoch=3), tmp_path / str(prefetch), progress=False)
        assert trainer.prefetch is False  # the CPU gathers in turn
        trainer.prefetch = prefetch
        trainer.fit()
        weights[prefetch] = load_file(latest_checkpoint(tmp_path / str(prefetch)).path(LAST_WEIGHTS))
    assert len(prefetching_epochs) == 2
    assert weights[True].keys() == weights[False].keys()
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in weights[False])


@pytest.mark.parametrize("ema_decay", [None, 0.9])
def test_resume_continues_exactly(dataset, tmp_path, ema_decay):
    config = tiny_config(dataset, "nsac", epochs=2, early_stopping_patience=10, ema_decay=ema_decay)
    Trainer(config, tmp_path / "straight", progress=False).fit()
    interrupted = Trainer(dataclasses.replace(config, epochs=1), tmp_path / "resumed", progress=False)
    interrupted.fit()
    # a new process would rebuild the trainer from the same config and resume
    (tmp_path / "resumed" / "config.json").write_text(json.dumps(Trainer(config, tmp_path / "x", progress=False).config.to_dict()))
    Trainer(config, tmp_path / "resumed", progress=False).fit(resume=True)
    a = load_file(latest_checkpoint(tmp_path / "straight").path(LAST_WEIGHTS))
    b = load_file(latest_checkpoint(tmp_path / "resumed").path(LAST_WEIGHTS))
    assert all(torch.equal(a[k], b[k]) for k in a)
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "resumed" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)  # with ema_decay: the average resumed too
    history = json.loads((tmp_path / "resumed" / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2]


def test_ema_publishes_and_validates_the_moving_average_of_the_steps(dataset, tmp_path, monkeypatch):
    """With ema_decay d the published weights are a_1 = w_1, a_k = a_{k-1} + (1 − d)(w_k − a_{k-1})
    over the weights w_k after each optimiser step, and the recorded validation loss is theirs."""
    decay, steps = 0.8, []
    original = Trainer._train_step

    def record(self, *args):
        terms = original(self, *args)
        steps.append({k: v.detach().clone() for k, v in self.model.named_parameters()})
        return terms

    monkeypatch.setattr(Trainer, "_train_step", record)
    trainer = Trainer(tiny_config(dataset, "gmle", max_batches_per_epoch=5, ema_decay=decay), tmp_path / "ema", progress=False)
    state = trainer.fit()  # one epoch: it always improves, so model.safetensors holds the average after it
    assert len(steps) == 5
    expected = dict(steps[0])
    for weights in steps[1:]:
        expected = {k: a + (1 - decay) * (weights[k] - a) for k, a in expected.items()}
    published = load_file(tmp_path / "ema" / "model.safetensors")
    eps = torch.finfo(torch.float32).eps
    for name, value in expected.items():  # five lerps, each rounded in float32 (torch's foreach lerp vs this formula)
        scale = max(float(value.abs().max()), max(float(w[name].abs().max()) for w in steps), 1e-30)
        assert torch.allclose(published[name], value, rtol=0, atol=16 * eps * scale), name
    assert not all(torch.equal(published[k], steps[-1][k]) for k in expected)  # not the last step's weights
    assert trainer.validate(0) == state.history[0]["val_total"]  # the recorded loss is the published weights'


def test_refuses_to_overwrite_a_run_and_resume_needs_the_same_config(dataset, tmp_path):
    config = tiny_config(dataset, "gmle")
    Trainer(config, tmp_path / "run", progress=False).fit()
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(config, tmp_path / "run", progress=False).fit()
    with pytest.raises(CheckpointError, match=r"another configuration than the run's config.json: lr 0.001 there, 0.5 now; "
                                              r"model.d_model 16 there, 32 now \(resume with the run's settings"):
        Trainer(dataclasses.replace(config, lr=0.5, model=dataclasses.replace(config.model, d_model=32)),
                tmp_path / "run", progress=False).fit(resume=True)


def test_checkpoint_errors_name_the_file(dataset, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(dataset, "gmle"), run, progress=False).fit()
    config = json.loads((run / "config.json").read_text())
    config["model"]["d_model"] = 32  # config and weights now disagree
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: weights do not match the architecture"):
        load_run(run)
    config["model"]["d_model"] = 16
    (run / "config.json").write_text(json.dumps(config))
    load_run(run)
    (run / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: sha256 .* differs from .* recorded in checksums\.json"):
        load_run(run)
    (run / "checksums.json").unlink()  # a run written before checksums were recorded, or stripped of them
    with pytest.raises(CheckpointError, match=r"model\.safetensors: no sha256 recorded in .*checksums\.json, so a damaged"):
        load_run(run)
    (run / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="weights file is missing"):
        load_run(run)
    (run / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_run(run)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_run(tmp_path / "nowhere")


@pytest.mark.parametrize("model", ["gmle", "nsac"])
def test_closed_loop_path_matches_the_dataset_path(dataset, tmp_path, model):
    """The published bug: the driven model never saw its training input layout. Here it must."""
    Trainer(tiny_config(dataset, model), tmp_path / model, progress=False).fit()
    agent = ControllerAgent(tmp_path / model, samples=4)
    data = SequenceDataset(dataset, [2], sequence_length=4, frame_stride=2)
    _, arrays = load_episode_arrays(data.episodes[0].sidecar_path)
    observations = arrays["observations"]
    item = 10
    step = int(data.index[item, 1])
    sample = data[item]
    torch.manual_seed(0)
    offline = agent.model.predict(network_frames(sample["frames"][None], data.kind), sample["timestamps"][None], samples=4)
    agent.reset()
    for t in range(step):  # drive through the episode as the closed loop does, frame by frame
        agent.act(observations[t], None)
    torch.manual_seed(0)
    online = agent.predict(observations[step])
    # the agent encodes one frame at a time (cached tokens), the dataset path all T at once:
    # same numbers up to float32 rounding of differently batched convolutions (tests/float_paths.py)
    tokens = sample["frames"].shape[0] * agent.model.tokens_per_frame
    assert_predictions_agree(online, offline, path_rtol(agent.model, tokens))


def test_nsac_trains_with_the_hinge_on_held_out_proxies(dataset, tmp_path):
    model = dataclasses.replace(tiny_model("nsac"), epistemic_regulariser="hinge", epistemic_margin=0.02)
    config = dataclasses.replace(tiny_config(dataset, "nsac", perturbation="proxies"), model=model)
    state = Trainer(config, tmp_path / "hinge", progress=False).fit()
    assert np.isfinite(state.best_val)
    history = json.loads((tmp_path / "hinge" / "history.json").read_text())
    epoch = history[0]
    # relu(m − (r_ood − r_id)) ≤ m + r_id per sequence, and mean r_id ≤ √(mean e_id) (Jensen)
    assert 0.0 <= epoch["train_regulariser"] <= 0.02 + epoch["train_epistemic_id"] ** 0.5 + 1e-4
    _, config = load_run(tmp_path / "hinge")
    assert (config.perturbation, config.model.epistemic_regulariser, config.model.epistemic_margin) == ("proxies", "hinge", 0.02)


def test_nsac_trains_with_twins_for_part_of_each_batch_and_records_the_share(dataset, tmp_path):
    state = Trainer(tiny_config(dataset, "nsac", twin_fraction=0.25), tmp_path / "quarter", progress=False).fit()
    assert np.isfinite(state.best_val)
    assert load_run(tmp_path / "quarter")[1].twin_fraction == 0.25


def test_bad_training_configs_raise(dataset, tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        ModelConfig(model="transformer")
    with pytest.raises(ValueError, match="unknown fields"):
        TrainConfig.from_dict({"data": str(dataset), "learning_rate": 1.0})
    with pytest.raises(ValueError, match="perturbation must be one of noise, proxies"):
        tiny_config(dataset, "nsac", perturbation="cutout")
    with pytest.raises(ValueError, match=r"twin_fraction.*\(0, 1\]"):
        tiny_config(dataset, "nsac", twin_fraction=0.0)
    with pytest.raises(ValueError, match="holds no samples"):
        Trainer(tiny_config(dataset, "gmle", val_seeds="7"), tmp_path / "r", progress=False)


def test_training_in_bfloat16_is_seeded_differs_from_float32_and_its_run_drives_in_float32(dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_amx_tiles", lambda: True)  # no warning on any CPU (the next test covers it)
    for name, setting in (("a", "bfloat16"), ("b", "bfloat16"), ("f", "float32")):
        Trainer(tiny_config(dataset, "nsac", precision=setting), tmp_path / name, progress=False).fit()
    a, b, f = (load_file(tmp_path / name / "model.safetensors") for name in "abf")
    assert all(torch.equal(a[k], b[k]) for k in a)  # one seed, one machine: one set of weights
    assert not all(torch.equal(a[k], f[k]) for k in a)
    assert all(value.dtype == torch.float32 for value in a.values())
    controller, config = load_run(tmp_path / "a")
    assert config.precision == "bfloat16"
    assert all(getattr(module, "autocast_dtype", None) is None for module in controller.modules())


def test_unknown_precision_is_refused(dataset):
    with pytest.raises(ValueError, match=r"precision must be one of float32, bfloat16, got 'float16'"):
        tiny_config(dataset, "nsac", precision="float16")


def test_bfloat16_warns_where_it_would_be_emulated(dataset, tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    assert slow_precision("float32", cpu) is None
    monkeypatch.setattr(precision, "cpu_has_amx_tiles", lambda: True)
    assert slow_precision("bfloat16", cpu) is None
    monkeypatch.setattr(precision, "cpu_has_amx_tiles", lambda: False)
    assert "no AMX tiles" in slow_precision("bfloat16", cpu)
    with pytest.warns(UserWarning, match="precision bfloat16: this CPU has no AMX tiles.*slower than in float32"):
        Trainer(tiny_config(dataset, "gmle", precision="bfloat16"), tmp_path / "r", progress=False)


def test_evaluate_offline_writes_one_table_with_clean_perturbed_and_auroc(dataset, tmp_path):
    from typer.testing import CliRunner

    from nsacdrive.cli import app

    for model in ("gmle", "nsac"):
        Trainer(tiny_config(dataset, model), tmp_path / model, progress=False).fit()
    result = CliRunner().invoke(app, ["evaluate-offline", str(tmp_path / "gmle"), str(tmp_path / "nsac"), "--data", str(dataset),
                                      "--colour-preset", "shift-3", "--out", str(tmp_path / "table")])
    assert result.exit_code == 0, result.output
    table = (tmp_path / "table" / "offline.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| gmle") or line.startswith("| nsac")]
    assert len(rows) == 2 * 2 * 3  # models × conditions × actions
    results = json.loads((tmp_path / "table" / "offline.json").read_text())["results"]
    assert {r["model"] for r in results} == {"gmle", "nsac"}
    for r in results:
        assert set(r["conditions"]) == {"clean", "shift-3"} and r["seeds"] == [2]
        assert 0.0 <= r["ood_auroc"]["steer"] <= 1.0
    csv_lines = (tmp_path / "table" / "offline.csv").read_text().splitlines()
    assert csv_lines[0].startswith("model,run,recalibration,condition,action,mse,nll,crps") and len(csv_lines) == 13
    assert all(line.split(",")[2] == "none" for line in csv_lines[1:])  # no calibration.json: raw predictions


def test_a_censored_pedal_run_is_scored_under_its_own_likelihood(dataset, tmp_path):
    from nsacdrive.eval.offline import evaluate_run, table_rows

    model = dataclasses.replace(tiny_model("nsac"), pedal_likelihood="censored")
    Trainer(dataclasses.replace(tiny_config(dataset, "nsac"), model=model), tmp_path / "censored", progress=False).fit()
    result = evaluate_run(tmp_path / "censored", dataset)
    censored = result["conditions"]["clean"]["per_action_censored"]
    assert set(censored) == {"steer", "gas", "brake"}
    for scores in censored.values():
        assert set(scores) == {"nll", "crps", "mace", "coverage_90"} and 0 <= scores["mace"] <= 0.5 and scores["crps"] > 0
    # steer is not censored: its censored scores are the Gaussian ones of the same predictions
    assert censored["steer"]["crps"] == pytest.approx(result["conditions"]["clean"]["per_action"]["steer"]["crps"], rel=1e-6)
    for metrics in result["conditions"]["clean"]["per_action"].values():  # sharpness is the RMS of s, s² = aleatoric + epistemic
        assert metrics["mean_aleatoric"] + metrics["mean_epistemic"] == pytest.approx(metrics["sharpness"] ** 2, rel=1e-9)
    row = table_rows([result])[1]
    assert row["action"] == "gas" and row["mace_censored"] == censored["gas"]["mace"]


def test_evaluate_offline_seed_repeats_report_mean_and_std(dataset, tmp_path):
    from typer.testing import CliRunner

    from nsacdrive.cli import app

    Trainer(tiny_config(dataset, "gmle"), tmp_path / "gmle", progress=False).fit()
    result = CliRunner().invoke(app, ["evaluate-offline", str(tmp_path / "gmle"), "--data", str(dataset), "--train-seeds", "2",
                                      "--out", str(tmp_path / "table")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "gmle" / "seed-repeats" / "seed4" / "model.safetensors").exists()
    assert " ± " in (tmp_path / "table" / "offline.md").read_text()
    missing = CliRunner().invoke(app, ["evaluate-offline", str(tmp_path / "gmle"), "--data", str(dataset),
                                       "--colour-preset", "shift-5", "--out", str(tmp_path / "t2")])
    assert missing.exit_code == 2 and "shift-5" in missing.output


def test_evaluate_offline_by_model_pools_the_seeds_of_each_model_and_refuses_mixed_recipes(dataset, tmp_path):
    from typer.testing import CliRunner

    from nsacdrive.cli import app
    from nsacdrive.eval.offline import evaluate_run

    for seed in (3, 4):
        Trainer(tiny_config(dataset, "gmle", seed=seed), tmp_path / f"gmle-s{seed}", progress=False).fit()
    Trainer(tiny_config(dataset, "gmle", lr=5e-4), tmp_path / "gmle-lr", progress=False).fit()
    runs = [str(tmp_path / "gmle-s3"), str(tmp_path / "gmle-s4")]
    result = CliRunner().invoke(app, ["evaluate-offline", *runs, "--data", str(dataset), "--by-model", "--out", str(tmp_path / "table")])
    assert result.exit_code == 0, result.output
    rows = [line for line in (tmp_path / "table" / "offline.md").read_text().splitlines() if line.startswith("| gmle")]
    assert len(rows) == 3 and all(" ± " in row for row in rows)  # one row per action, mean ± std
    per_run = [evaluate_run(tmp_path / f"gmle-s{seed}", dataset)["conditions"]["clean"]["per_action"]["steer"]["mse"] for seed in (3, 4)]
    csv_row = (tmp_path / "table" / "offline.csv").read_text().splitlines()[1].split(",")
    header = (tmp_path / "table" / "offline.csv").read_text().splitlines()[0].split(",")
    assert float(csv_row[header.index("mse")]) == pytest.approx(np.mean(per_run), rel=1e-6)
    assert float(csv_row[header.index("mse_std")]) == pytest.approx(np.std(per_run), rel=1e-6, abs=1e-12)
    assert "gmle-s3: 1/1 condition" in result.output  # the progress line each run ends with (in a log: whole lines)
    mixed = CliRunner().invoke(app, ["evaluate-offline", runs[0], str(tmp_path / "gmle-lr"), "--data", str(dataset), "--by-model",
                                     "--out", str(tmp_path / "t2")])
    assert mixed.exit_code == 2 and "differ in lr" in mixed.output and not (tmp_path / "t2").exists()


def test_evaluate_offline_loads_each_run_once(dataset, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import nsacdrive.controllers.run as run_module
    from nsacdrive.cli import app

    Trainer(tiny_config(dataset, "gmle"), tmp_path / "gmle", progress=False).fit()
    loads = []
    build = run_module.build_controller
    monkeypatch.setattr(run_module, "build_controller", lambda config: loads.append(config.model) or build(config))
    result = CliRunner().invoke(app, ["evaluate-offline", str(tmp_path / "gmle"), "--data", str(dataset), "--train-seeds", "2",
                                      "--out", str(tmp_path / "table")])
    assert result.exit_code == 0, result.output
    # the up-front check's load computes the run's rows; the retraining is loaded when its rows are computed
    assert loads == ["gmle", "gmle"]


def test_reference_encoder_builds_trains_and_keeps_batchnorm_statistics_for_perturbed_passes():
    from nsacdrive.controllers.registry import build_controller

    torch.manual_seed(0)
    controller = build_controller(ModelConfig(model="nsac", encoder=EncoderConfig(kind="reference"), d_model=16, num_heads=4))
    frames, timestamps = torch.rand(4, 4, 3, 84, 96), torch.tensor([[-0.12, -0.08, -0.04, 0.0]]).expand(4, 4)
    norm = controller.encoder.features[9]
    controller.train()
    controller.encoder(frames)  # one clean pass moves the running statistics
    before = norm.running_mean.clone()
    terms = controller.training_loss(frames, timestamps, torch.rand(4, 3), perturb=lambda x: x + 5.0)
    terms["total"].backward()
    clean_only = norm.running_mean.clone()
    controller.encoder(frames)
    assert not torch.equal(before, clean_only)  # the clean pass inside the loss did update them …
    torch.manual_seed(0)
    reference = build_controller(ModelConfig(model="nsac", encoder=EncoderConfig(kind="reference"), d_model=16, num_heads=4)).train()
    reference.encoder(frames)
    reference.encoder(frames)
    torch.testing.assert_close(clean_only, reference.encoder.features[9].running_mean)  # … the +5 pass did not
    assert controller.predict(frames, timestamps, samples=3).mean.shape == (4, 3)
