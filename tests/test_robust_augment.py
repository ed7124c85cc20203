"""Augmentation for unseen appearance changes: labels stay consistent, every draw is the seed's, the
consistency term and the encoder's input normalisation behave as stated on known inputs."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_training import dataset, tiny_config  # noqa: F401 (the module fixture is used by name)

from nsacdrive.controllers.baselines import MemberView
from nsacdrive.controllers.encoders import EncoderConfig, make_encoder, normalise_input
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.registry import build_controller
from nsacdrive.controllers.robust_augment import RobustAugmentConfig, consistency_loss, robust_augment, robust_augment_yuv
from nsacdrive.controllers.training import BatchViews, Trainer

EVERYTHING = RobustAugmentConfig(probability=1.0, shift=0.05, rotation=5.0, scale=0.1, flip=0.5, gamma=0.5, blur=1.0,
                                 noise=0.05, random_conv=0.5, erase=0.5)
# a bilinear sample meant for a pixel centre lands off it by the float32 rounding of its grid coordinate,
# a few ulps of the frame's width (96 px); values in [0, 1] move by at most that share of a pixel
SAMPLING_ATOL = 4 * 96 * torch.finfo(torch.float32).eps


def frames(batch: int = 6, length: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, length, 3, 84, 96, generator=torch.Generator().manual_seed(seed))


def labels(batch: int = 6) -> torch.Tensor:
    return torch.stack([torch.linspace(-0.9, 0.9, batch), torch.full((batch,), 0.5), torch.zeros(batch)], 1)


def test_switched_off_it_changes_nothing_and_draws_nothing():
    generator = torch.Generator().manual_seed(1)
    state = generator.get_state()
    x, y = frames(), labels()
    out = robust_augment(x, y, RobustAugmentConfig(shift=0.1, flip=1.0), generator)
    assert out.frames is x and out.target is y and not out.flipped.any()
    assert torch.equal(generator.get_state(), state)


def test_the_same_seed_gives_the_same_augmentation_and_another_seed_does_not():
    x, y = frames(), labels()
    first, again = (robust_augment(x, y, EVERYTHING, torch.Generator().manual_seed(5)) for _ in range(2))
    other = robust_augment(x, y, EVERYTHING, torch.Generator().manual_seed(6))
    assert torch.equal(first.frames, again.frames) and torch.equal(first.target, again.target)
    assert not torch.equal(first.frames, other.frames)
    assert torch.equal(x, frames()) and torch.equal(y, labels())  # the inputs are left as they were


def test_a_mirror_flips_the_picture_and_the_steering_only():
    x, y = frames(), labels()
    out = robust_augment(x, y, RobustAugmentConfig(probability=1.0, flip=1.0), torch.Generator().manual_seed(2))
    assert out.flipped.all()
    torch.testing.assert_close(out.frames, x.flip(-1), atol=SAMPLING_ATOL, rtol=0)
    torch.testing.assert_close(out.target, y * torch.tensor([-1.0, 1.0, 1.0]))


def test_every_frame_of_a_sequence_gets_the_same_transform():
    still = frames(batch=5, length=1).expand(5, 4, 3, 84, 96).contiguous()
    out = robust_augment(still, labels(5), EVERYTHING, torch.Generator().manual_seed(3)).frames
    for t in range(1, 4):
        if not EVERYTHING.noise:  # noise is drawn per pixel and frame
            assert torch.equal(out[:, t], out[:, 0])
    geometric = RobustAugmentConfig(probability=1.0, shift=0.1, rotation=10.0, scale=0.2, random_conv=1.0, gamma=0.5, blur=1.5)
    out = robust_augment(still, labels(5), geometric, torch.Generator().manual_seed(3)).frames
    assert not torch.equal(out, still)
    for t in range(1, 4):
        torch.testing.assert_close(out[:, t], out[:, 0], atol=0, rtol=0)


def test_labels_other_than_a_mirror_stay_and_values_stay_in_range():
    x, y = frames(batch=32), labels(32)
    out = robust_augment(x, y, EVERYTHING, torch.Generator().manual_seed(4))
    assert 0 < out.flipped.sum() < 32
    kept = ~out.flipped
    assert torch.equal(out.target[kept], y[kept]) and torch.equal(out.target[out.flipped, 0], -y[out.flipped, 0])
    assert out.frames.min() >= 0 and out.frames.max() <= 1 and torch.isfinite(out.frames).all()


def test_an_erased_rectangle_is_one_colour_in_one_place_for_the_whole_sequence():
    x = frames(batch=8)
    config = RobustAugmentConfig(probability=1.0, erase=1.0, erase_area=0.3)
    out = robust_augment(x, labels(8), config, torch.Generator().manual_seed(9)).frames
    changed = (out != x).any(2)  # [B, T, H, W]
    for sequence in range(8):
        assert all(torch.equal(changed[sequence, t], changed[sequence, 0]) for t in range(4))
        covered = changed[sequence, 0]
        assert 0 < covered.float().mean() <= 0.3 + 2 * (84 + 96) / (84 * 96)  # the area, give or take its border pixels
        rows, cols = covered.any(1).nonzero().flatten(), covered.any(0).nonzero().flatten()
        box = out[sequence, :, :, rows.min():rows.max() + 1, cols.min():cols.max() + 1]
        assert torch.equal(box, box[:, :, :1, :1].expand_as(box))  # one colour, a rectangle
    assert torch.equal(out[~changed[:, :, None].expand_as(out)], x[~changed[:, :, None].expand_as(x)])


def test_front_camera_frames_are_augmented_in_rgb_and_stay_in_their_range():
    x = frames() * 2 - 1
    out = robust_augment_yuv(x, labels(), EVERYTHING, torch.Generator().manual_seed(7))
    assert out.frames.shape == x.shape and out.frames.min() >= -1 and out.frames.max() <= 1
    assert torch.equal(out.target[out.flipped, 0], -labels()[out.flipped, 0])


@pytest.mark.parametrize(("field", "value"), [("probability", 1.5), ("shift", -0.1), ("rotation", 90.0), ("noise", 0.9),
                                              ("erase_area", 0.0)])
def test_out_of_range_settings_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"robust_augment.*{field}"):
        RobustAugmentConfig(**{field: value})


def test_the_consistency_term_on_known_tokens():
    clean = torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]]])
    same = consistency_loss(clean * 3, clean, torch.tensor([True, True]))
    assert float(same) == pytest.approx(0.0, abs=1e-7)  # unit-normalised: a scaled token is the same direction
    augmented = torch.tensor([[[0.0, 1.0]], [[0.0, 5.0]]], requires_grad=True)
    loss = consistency_loss(augmented, clean, torch.tensor([True, True]))
    assert float(loss.detach()) == pytest.approx(1.0)  # |e2 − e1|² = 2 for the first, 0 for the second
    assert float(consistency_loss(augmented, clean, torch.tensor([False, True])).detach()) == pytest.approx(0.0, abs=1e-7)
    assert float(consistency_loss(augmented, clean, torch.tensor([False, False])).detach()) == 0.0
    loss.backward()
    assert augmented.grad is not None and augmented.grad[0].abs().sum() > 0


@pytest.mark.parametrize(("norm", "gain", "offset"), [("frame", 1.7, 0.2), ("channel", torch.tensor([0.5, 1.2, 2.0]), torch.tensor([0.1, -0.2, 0.3]))])
def test_input_normalisation_discards_brightness_and_contrast(norm, gain, offset):
    images = torch.rand(3, 3, 84, 96, generator=torch.Generator().manual_seed(8))
    gain = torch.as_tensor(gain).reshape(-1, 1, 1)
    offset = torch.as_tensor(offset).reshape(-1, 1, 1)
    changed = images * gain + offset
    # (a·x + b − mean) / (a·std + eps) is x's standardisation but for the eps: z moves by at most
    # |z| · eps / (a·std) (and float32 rounding, far below that)
    standard = normalise_input(images, norm)
    bound = float(standard.abs().max()) * 1e-3 / (float(gain.min()) * float(images.std()))
    torch.testing.assert_close(normalise_input(changed, norm), standard, atol=bound, rtol=0)
    assert normalise_input(images, "none") is images
    assert not torch.allclose(normalise_input(changed, "none"), normalise_input(images, "none"))
    encoder = make_encoder(EncoderConfig(input_norm=norm)).eval()
    seen = []
    encoder.features[0].register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))
    with torch.no_grad():
        encoder(changed[None])
    assert torch.equal(seen[0], normalise_input(changed, norm))  # what the convolutions read


def test_an_unknown_input_normalisation_is_refused():
    with pytest.raises(ValueError, match="input_norm"):
        EncoderConfig(input_norm="batch")


def test_a_run_trains_with_every_switch_and_logs_the_consistency_term(dataset, tmp_path):  # noqa: F811
    config = tiny_config(dataset, "nsac", robust_augment=EVERYTHING, consistency=0.5, perturbation="proxies")
    model = dataclasses.replace(config.model, encoder=dataclasses.replace(config.model.encoder, input_norm="frame"))
    config = dataclasses.replace(config, model=model)
    Trainer(config, tmp_path / "robust", progress=False).fit()
    epoch = json.loads((tmp_path / "robust" / "history.json").read_text())[0]
    assert epoch["train_consistency"] >= 0
    again = Trainer(config, tmp_path / "again", progress=False)
    again.fit()
    first = (tmp_path / "robust" / "model.safetensors").read_bytes()
    assert first == (tmp_path / "again" / "model.safetensors").read_bytes()  # the same seed, the same weights


def test_the_cost_bench_times_a_robust_recipe_against_its_baseline(capsys):
    from bench.augment_cost import main

    main(["configs/quality.json", "configs/quality-robust.json", "--batch", "2", "--pairs", "1"])
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("configs/quality-robust.json") and row.endswith("×")


def test_robust_members_needs_an_ensemble_robust_augmentation_and_plain_members(dataset):  # noqa: F811
    erase = RobustAugmentConfig(probability=0.5, erase=1.0)
    config = tiny_config(dataset, "ensemble", robust_augment=erase, robust_members=1)
    assert config.robust_members == 1
    with pytest.raises(ValueError, match="ensembles only"):
        tiny_config(dataset, "nsac", robust_augment=erase, robust_members=1)
    with pytest.raises(ValueError, match="robust_augment.probability"):
        tiny_config(dataset, "ensemble", robust_members=1)
    with pytest.raises(ValueError, match="below model.members"):
        tiny_config(dataset, "ensemble", robust_augment=erase, robust_members=config.model.members)
    with pytest.raises(ValueError, match="robust_members"):
        tiny_config(dataset, "ensemble", robust_augment=erase, robust_members=0)


def test_member_views_give_the_first_members_the_robust_views_and_the_rest_colour_alone():
    x, y = frames(), labels()
    flips = RobustAugmentConfig(probability=1.0, flip=1.0)
    augmented = robust_augment(x, y, flips, torch.Generator().manual_seed(4))
    views = BatchViews(augmented, None, x, y).member_views(members=3, robust_members=1)
    assert views[0].frames is augmented.frames and torch.equal(views[0].target[:, 0], -y[:, 0])  # mirrored, steering negated
    assert all(view.frames is x and view.target is y and view.anchor is None for view in views[1:])


def test_the_ensemble_loss_on_views_is_each_member_on_its_own_view():
    model = build_controller(ModelConfig(model="ensemble", members=3)).train()
    x, y = frames(batch=2), labels(batch=2)
    times = torch.arange(4, dtype=torch.float32).expand(2, 4)
    views = [MemberView(x, y), MemberView(x.flip(-1), y), MemberView(x * 0.5, y)]
    terms = model.views_loss(views, times)
    alone = [float(model.member_loss(k, view.frames, times, view.target)["total"].detach()) for k, view in enumerate(views)]
    for k, loss in enumerate(alone):
        assert float(terms[f"member{k}"]) == loss
    # a sum of three float32 numbers: each addition rounds by at most half an ulp of the running sum
    assert float(terms["total"].detach()) == pytest.approx(sum(alone), abs=3 * torch.finfo(torch.float32).eps * sum(map(abs, alone)))
    same = model.training_loss(x, times, y)["total"].detach()
    assert float(same) == float(model.views_loss([MemberView(x, y)] * 3, times)["total"].detach())


def test_an_ensemble_trains_with_robust_members_and_the_seed_gives_the_same_weights(dataset, tmp_path):  # noqa: F811
    config = tiny_config(dataset, "ensemble", robust_augment=RobustAugmentConfig(probability=1.0, shift=0.05, erase=1.0),
                         robust_members=1)
    for name in ("first", "again"):
        Trainer(config, tmp_path / name, progress=False).fit()
    first = (tmp_path / "first" / "model.safetensors").read_bytes()
    assert first == (tmp_path / "again" / "model.safetensors").read_bytes()
    plain = dataclasses.replace(config, robust_members=None)
    Trainer(plain, tmp_path / "plain", progress=False).fit()
    assert first != (tmp_path / "plain" / "model.safetensors").read_bytes()  # the plain member saw other frames
