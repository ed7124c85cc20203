"""Train a controller on recorded demonstrations: seeded, resumable, early-stopped.

One epoch visits the training split (track seeds disjoint from validation and test) in the
order of :class:`nsacdrive.data_collection.dataset.EpisodeGroupedSampler`, augments every sequence the
way its observation kind needs — every kind: recoloured by :func:`nsacdrive.controllers.augment.colour_augment`
(``augment``; in YUV for Udacity frames, :func:`~nsacdrive.controllers.augment.colour_augment_yuv`);
Udacity also: side cameras, flips, shifts, shadows and brightness on the raw frames with the
steering label adjusted (``udacity_augment``, :func:`nsacdrive.controllers.udacity_augment.augment_sequence`) — and steps
AdamW on the head's loss (heads that need perturbed inputs get frames + N(μ_pert, σ_pert²), or the
held-out proxies of :mod:`nsacdrive.controllers.ood_proxies` with ``perturbation="proxies"``, in
preprocessed units — [0, 1] for CarRacing, [−1, 1] for Udacity — with BatchNorm statistics
frozen for that pass).

``data: "udacity:DIR"`` trains on a Udacity recording (imported once, see
:func:`nsacdrive.data_collection.udacity_import.udacity_dataset`) and sets ``model.observation`` to
``udacity`` when the model config does not name one (so its encoder defaults to ``nvidia``). After each epoch the validation loss drives a
ReduceLROnPlateau schedule and early stopping; the best weights are ``model.safetensors``. With
``ema_decay`` the weights validated and published are the exponential moving average of the
trained weights over the optimiser's steps (Polyak averaging, :class:`torch.optim.swa_utils.AveragedModel`):
late in training single steps move a heavy-tailed validation NLL by more than a plateau's
worth, and the average moves far less (on Lévy's quality recipe it did not change the laps; docs/engineering-notes.md).

Determinism and exact resume: every source of randomness of epoch e (sampler order,
augmentation, perturbation, MC draws, dropout) is seeded from (seed, e), and the state saved
after each epoch (weights, their average when enabled, optimiser, scheduler, counters) is all that
the next epoch reads, so ``--resume`` after a kill gives the same weights as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import shutil
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader
from tqdm import tqdm

from nsacdrive.common.atomic import atomic_write_json, remove_partial_files
from nsacdrive.common.heap import keep_freed_memory
from nsacdrive.common.prefetch import prefetched
from nsacdrive.common.progress import progress_bar
from nsacdrive.common.resume import differences, plain
from nsacdrive.common.seeds import derive_seed, format_seeds, parse_seeds
from nsacdrive.common.versions import VERSIONS_FILE, check_versions, write_versions
from nsacdrive.controllers.augment import colour_augment, colour_augment_yuv
from nsacdrive.controllers.baselines import MemberView
from nsacdrive.controllers.checkpoint import (
    BEST_WEIGHTS,
    CONFIG_FILE,
    HISTORY_FILE,
    LAST_WEIGHTS,
    RESUME_DIR,
    STATE_SKELETON,
    STATE_TENSORS,
    WEIGHTS_FILE,
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    load_weights,
    load_weights_bytes,
    publish,
    read_config,
    weights_bytes,
    write_checkpoint,
    write_config,
)
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.ood_proxies import make_perturbation
from nsacdrive.controllers.precision import set_encoder_precision, slow_precision
from nsacdrive.controllers.registry import build_controller
from nsacdrive.controllers.robust_augment import Anchor, Augmented, robust_augment, robust_augment_yuv
from nsacdrive.controllers.run import usable_device, use_deterministic_kernels
from nsacdrive.controllers.state_codec import decode_state, encode_state
from nsacdrive.controllers.train_config import TrainConfig
from nsacdrive.controllers.udacity_augment import augment_sequence
from nsacdrive.data_collection.dataset import (
    EpisodeGroupedSampler,
    SequenceAugment,
    SequenceDataset,
    batch_loader,
    load_episode_records,
    network_frames,
)
from nsacdrive.envs.udacity_observation import UDACITY_CROP_ROWS


def resolve_split(config: TrainConfig) -> TrainConfig:
    """Replace ``auto`` seed ranges by explicit, disjoint ones taken from the dataset."""
    if config.train_seeds != "auto":  # TrainConfig holds all three explicit ranges or all three 'auto'
        return config
    seeds = sorted({int(r.sidecar["track_seed"]) for r in load_episode_records(Path(config.data), None, "raise")})
    if len(seeds) < 3:
        raise ValueError(f"{config.data}: an automatic split needs >= 3 track seeds, found {len(seeds)} "
                         "(a Udacity recording gets one per episode: import it with a smaller --episode-length)")
    n_held = max(1, round(0.1 * len(seeds)))
    test, val, train = seeds[-n_held:], seeds[-2 * n_held : -n_held], seeds[: -2 * n_held]
    return dataclasses.replace(config, train_seeds=format_seeds(train), val_seeds=format_seeds(val), test_seeds=format_seeds(test))


class TrainingDiverged(ValueError):
    """A NaN or infinite loss or gradient: training stops (its weights would predict NaN); the
    message names the epoch, the batch and the episodes in it."""


def describe_batch(dataset: SequenceDataset, batch: dict[str, torch.Tensor], limit: int = 8) -> str:
    """The episodes (files, track seeds, newest-frame steps) a batch was drawn from, for error messages."""
    steps: dict[int, list[int]] = {}
    for episode, step in zip(batch["episode"].tolist(), batch["step"].tolist(), strict=True):
        steps.setdefault(int(episode), []).append(int(step))
    parts = [f"{dataset.episodes[e].sidecar_path} (track seed {dataset.episodes[e].sidecar['track_seed']}, steps {min(s)}-{max(s)})"
             for e, s in sorted(steps.items())[:limit]]
    more = f" and {len(steps) - limit} more" if len(steps) > limit else ""
    return "; ".join(parts) + more


@dataclass
class TrainState:
    epoch: int = 0  # epochs completed
    best_val: float = math.inf
    bad_epochs: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class BatchViews:
    """A training batch as augmented: ``augmented`` (colour, then the robust families), the consistency
    term's ``anchor``, and ``coloured`` with its ``target``, the colour augmentation alone."""

    augmented: Augmented
    anchor: Anchor | None
    coloured: torch.Tensor
    target: torch.Tensor

    def member_views(self, members: int, robust_members: int) -> list[MemberView]:
        """An ensemble's views: its first ``robust_members`` members see the robust views, the rest the
        colour-augmented batch alone (``TrainConfig.robust_members``)."""
        robust = MemberView(self.augmented.frames, self.augmented.target, self.anchor)
        plain = MemberView(self.coloured, self.target)
        return [robust] * robust_members + [plain] * (members - robust_members)


def augment_batch(frames: torch.Tensor, target: torch.Tensor, config: TrainConfig, generator: torch.Generator) -> BatchViews:
    """A training batch's preprocessed frames (CarRacing RGB or Udacity YUV) and labels augmented as
    ``config`` says: colour, then the robust families (which may mirror a sequence and its steering
    label); and, with ``config.consistency``, the clean views the consistency term anchors to."""
    udacity = config.model.observation == "udacity"
    coloured = (colour_augment_yuv if udacity else colour_augment)(frames, config.augment, generator)
    augmented = (robust_augment_yuv if udacity else robust_augment)(coloured, target, config.robust_augment, generator)
    anchor = Anchor(frames, config.consistency, ~augmented.flipped.to(frames.device)) if config.consistency else None
    return BatchViews(augmented, anchor, coloured, target)


def batch_loss(model: torch.nn.Module, views: BatchViews, timestamps: torch.Tensor, config: TrainConfig,
               perturb: Callable[[torch.Tensor], torch.Tensor] | None, speed: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The model's training loss on an augmented batch: every member on the robust views, or, with
    ``config.robust_members``, an ensemble's members split between the two views."""
    if config.robust_members is not None:
        return model.views_loss(views.member_views(config.model.members, config.robust_members), timestamps, perturb, speed)
    return model.training_loss(views.augmented.frames, timestamps, views.augmented.target, perturb=perturb, speed=speed,
                               anchor=views.anchor)


class Trainer:
    """Owns the model, data, optimiser and run folder of one training run."""

    def __init__(self, config: TrainConfig, run_dir: str | Path, progress: bool = True) -> None:
        self.config = resolve_split(config)
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.device = usable_device(self.config.device, "training config device")
        # on a GPU the next batch is gathered (decoded, augmented) on the CPU while the GPU trains on
        # this one; on the CPU the two would share the same cores (no gain measured on two)
        self.prefetch = self.device.type == "cuda"
        use_deterministic_kernels(self.device)
        keep_freed_memory()  # every step frees and reallocates the same large tensors
        torch.manual_seed(self.config.seed)
        self.model = build_controller(self.config.model).to(self.device)
        cfg = self.config
        set_encoder_precision(self.model, cfg.precision)
        reason = slow_precision(cfg.precision, self.device)
        if reason is not None:
            warnings.warn(f"precision {cfg.precision}: {reason}, so training will be slower than in float32", stacklevel=2)
        if cfg.init_from is not None:
            self._initialise_from(Path(cfg.init_from))
        dataset_kw = dict(sequence_length=cfg.sequence_length, frame_stride=cfg.frame_stride,
                          cache_episodes=cfg.cache_episodes, colour_presets=cfg.train_presets, observation=cfg.model.observation,
                          camera_fov=cfg.model.camera_fov)
        self.train_set = SequenceDataset(cfg.data, parse_seeds(cfg.train_seeds, "train seeds"), augment=self._sequence_augment(),
                                         **dataset_kw)
        self.val_set = SequenceDataset(cfg.data, parse_seeds(cfg.val_seeds, "val seeds"), **dataset_kw)
        for name, dataset in (("train", self.train_set), ("val", self.val_set)):
            if len(dataset) == 0:
                raise ValueError(f"{cfg.data}: the {name} split ({getattr(cfg, name + '_seeds')}) holds no samples")
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer, factor=cfg.plateau_factor, patience=cfg.plateau_patience)
        self.average = None if cfg.ema_decay is None else AveragedModel(
            self.model, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema_decay), use_buffers=True)
        self.state = TrainState()

    @property
    def published_model(self) -> torch.nn.Module:
        """The weights that are validated and become ``model.safetensors``: the EMA when enabled."""
        return self.model if self.average is None else self.average.module

    def _initialise_from(self, run_dir: Path) -> None:
        """Start from another run's best weights; its architecture must be this run's (the loss's
        settings, :data:`nsacdrive.controllers.model_config.OBJECTIVE_FIELDS`, may differ)."""
        source, own = ModelConfig.from_dict(read_config(run_dir)["model"]).architecture(), self.config.model.architecture()
        differing = {name: (source[name], own[name]) for name in own if source[name] != own[name]}
        if differing:
            raise CheckpointError(f"init_from {run_dir}: its model differs from this run's in "
                                  + ", ".join(f"{name} ({theirs} there, {ours} here)" for name, (theirs, ours) in differing.items()))
        load_weights(self.model, run_dir / WEIGHTS_FILE)

    def _sequence_augment(self) -> SequenceAugment | None:
        """Per-sample augmentation of raw frames (Udacity observations), or None."""
        cfg = self.config
        if cfg.model.observation != "udacity" or cfg.udacity_augment.probability == 0:
            return None
        return functools.partial(augment_sequence, config=cfg.udacity_augment, rows=UDACITY_CROP_ROWS)

    def _network_frames(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The batch's uint8 frames moved to the training device, then scaled there."""
        return network_frames(batch["frames"].to(self.device, non_blocking=True), self.train_set.kind)


    # ------------------------------------------------------------------ persistence
    def save_checkpoint(self, improved: bool) -> None:
        """Commit this epoch's resume state as one unit (resume/epoch-NNNN), then publish its best
        weights as model.safetensors and the history (see :mod:`nsacdrive.controllers.checkpoint`)."""
        last = weights_bytes(self.model)
        previous = latest_checkpoint(self.run_dir)
        best = weights_bytes(self.published_model) if improved or previous is None else previous.read(BEST_WEIGHTS)
        skeleton, tensors = encode_state({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                                          "train_state": dataclasses.asdict(self.state),
                                          "average": None if self.average is None else self.average.state_dict()})
        checkpoint = write_checkpoint(self.run_dir, self.state.epoch, {LAST_WEIGHTS: last, BEST_WEIGHTS: best,
                                                                       STATE_SKELETON: skeleton, STATE_TENSORS: tensors})
        self._publish(checkpoint)

    def _publish(self, checkpoint: Checkpoint) -> None:
        publish(self.run_dir, checkpoint)
        atomic_write_json(self.run_dir / HISTORY_FILE, self.state.history)

    def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Continue from ``checkpoint`` (verified first); the config must be the run's config.json."""
        # through the dataclass, so fields added since the run was written compare at their defaults
        on_disk, now = plain(TrainConfig.from_dict(read_config(self.run_dir)).to_dict()), plain(self.config.to_dict())
        changed = [c for name in sorted(on_disk.keys() | now.keys()) for c in differences(name, on_disk.get(name), now.get(name))]
        if changed:
            raise CheckpointError(f"{self.run_dir}: --resume with another configuration than the run's config.json: "
                                  + "; ".join(f"{c.name} {json.dumps(c.recorded)} there, {json.dumps(c.requested)} now" for c in changed[:8])
                                  + (f"; and {len(changed) - 8} more" if len(changed) > 8 else "")
                                  + " (resume with the run's settings, or train into another --out)")
        check_versions(self.run_dir)
        files = checkpoint.read_all()  # each file read and its sha256 checked once, all before any is used
        load_weights_bytes(self.model, files[LAST_WEIGHTS], checkpoint.path(LAST_WEIGHTS))
        where = f"{checkpoint.path(STATE_SKELETON)} + {STATE_TENSORS}"
        blob = decode_state(files[STATE_SKELETON], files[STATE_TENSORS], where)
        try:
            self.optimizer.load_state_dict(blob["optimizer"])
            self.scheduler.load_state_dict(blob["scheduler"])
            if self.average is not None:
                self.average.load_state_dict(blob["average"])
            self.state = TrainState(**blob["train_state"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{where}: not the trainer state of this run's configuration ({type(exc).__name__}: {exc})") from None
        if self.state.epoch != checkpoint.epoch:
            raise CheckpointError(f"{where}: holds the state after epoch {self.state.epoch}, but its folder is {checkpoint.folder.name}")
        self._publish(checkpoint)  # repairs a kill between the checkpoint's commit and its publication

    def _start(self) -> None:
        """A new run in ``run_dir``, which must not hold another one (:meth:`fit` refused one without ``resume``)."""
        if (self.run_dir / WEIGHTS_FILE).exists():
            raise CheckpointError(f"{self.run_dir}: --resume found {WEIGHTS_FILE} but no complete checkpoint in {RESUME_DIR}/ "
                                  "(a run from an older nsacdrive, or resume/ was removed); train into another run folder")
        write_config(self.run_dir, self.config.to_dict())
        write_versions(self.run_dir)

    # ------------------------------------------------------------------ epochs
    def _perturb(self, generator: torch.Generator):
        cfg = self.config
        return make_perturbation(cfg.perturbation, generator, cfg.perturb_mean, cfg.perturb_std, cfg.twin_fraction)

    def _batches(self, dataset: SequenceDataset, epoch: int) -> DataLoader:
        cfg = self.config
        passes = 1 if cfg.min_batches_per_epoch is None else max(1, math.ceil(cfg.min_batches_per_epoch * cfg.batch_size / len(dataset)))
        sampler = EpisodeGroupedSampler(dataset, seed=cfg.seed, passes=passes)
        sampler.set_epoch(epoch)
        return batch_loader(dataset, self.config.batch_size, sampler, pin_memory=self.device.type == "cuda")

    def _run_epoch(self, epoch: int) -> dict[str, float]:
        cfg = self.config
        seed = derive_seed(cfg.seed, epoch)
        torch.manual_seed(seed)
        augment_rng = torch.Generator().manual_seed(seed + 1)
        perturb_rng = torch.Generator().manual_seed(seed + 2)
        self.train_set.reseed(seed + 3)
        self.model.train()
        loader = self._batches(self.train_set, epoch)
        n_batches = len(loader) if cfg.max_batches_per_epoch is None else min(len(loader), cfg.max_batches_per_epoch)
        totals: dict[str, float] = {}
        start = time.perf_counter()
        chosen = itertools.islice(loader, n_batches)  # exactly n_batches gathered
        with (progress_bar(total=n_batches, desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch", disable=not self.progress, leave=False) as bar,
              prefetched(chosen) if self.prefetch else nullcontext(chosen) as batches):
            for index, batch in enumerate(batches):
                terms = self._train_step(batch, f"epoch {epoch + 1}, training batch {index + 1}", augment_rng, perturb_rng)
                for key, value in terms.items():
                    totals[key] = totals.get(key, 0.0) + value
                bar.update(1)
                bar.set_postfix(loss=f"{totals['total'] / (index + 1):.4f}")
        train_terms = {f"train_{k}": v / max(n_batches, 1) for k, v in totals.items()}
        # seconds per training step, its batch's gathering included (the throughput figure), and the validation's
        step_seconds, start = (time.perf_counter() - start) / max(n_batches, 1), time.perf_counter()
        val_total = self.validate(epoch)
        return {**train_terms, "val_total": val_total, "step_seconds": step_seconds, "val_seconds": time.perf_counter() - start}

    def _train_step(self, batch: dict[str, torch.Tensor], where: str, augment_rng: torch.Generator,
                    perturb_rng: torch.Generator) -> dict[str, float]:
        """One optimiser step on ``batch``; stops with :class:`TrainingDiverged` on a NaN/inf loss or gradient."""
        clean = self._network_frames(batch)
        views = augment_batch(clean, batch["action"].to(self.device), self.config, augment_rng)
        terms = batch_loss(self.model, views, batch["timestamps"].to(self.device), self.config, self._perturb(perturb_rng),
                           batch["speed"].to(self.device))
        self.optimizer.zero_grad(set_to_none=True)
        terms["total"].backward()
        norms, loss = self._clip_gradients(), terms["total"].detach()
        # one host sync for both (a NaN loss term with no gradient path leaves the norm finite); which failed is looked up after
        if not bool(torch.isfinite(norms).all() & torch.isfinite(loss)):
            what, value = ("gradient norm", norms) if bool(torch.isfinite(loss)) else ("loss", loss)
            raise self._diverged(what, value.cpu().tolist(), where, self.train_set, batch)
        self.optimizer.step()
        if self.average is not None:
            self.average.update_parameters(self.model)
        return {key: float(value.detach()) for key, value in terms.items()}

    def _clip_gradients(self) -> torch.Tensor:
        """Clip by global norm; ensemble members each on their own, so members stay independent.
        Returns the norms before clipping (one per member)."""
        members = getattr(self.model, "members", None)
        groups = [list(self.model.member_parameters(k)) for k in range(len(members))] if members is not None else [list(self.model.parameters())]
        return torch.stack([torch.nn.utils.clip_grad_norm_(group, self.config.grad_clip) for group in groups])

    def _diverged(self, what: str, value: float | list[float], where: str, dataset: SequenceDataset,
                  batch: dict[str, torch.Tensor]) -> TrainingDiverged:
        """The error for a non-finite ``what`` (its ``value``), naming ``where`` and the batch's episodes."""
        return TrainingDiverged(f"{self.run_dir}: {where}: the {what} is {value}, training stopped "
                                f"(lr {self.config.lr}; a lower lr, or the episodes of this batch, may be the cause): "
                                f"{describe_batch(dataset, batch)}")

    @torch.no_grad()
    def validate(self, epoch: int) -> float:
        """Mean validation loss of :attr:`published_model` (no augmentation; perturbation and MC draws seeded per epoch)."""
        seed = derive_seed(self.config.seed, 10_000 + epoch)
        torch.manual_seed(seed)
        perturb_rng = torch.Generator().manual_seed(seed)
        model = self.published_model
        model.eval()
        total, count = 0.0, 0
        for index, batch in enumerate(self._batches(self.val_set, 0)):
            if self.config.max_val_batches is not None and index >= self.config.max_val_batches:
                break
            with torch.no_grad():  # the loss's value only: no graph to build
                terms = model.training_loss(self._network_frames(batch), batch["timestamps"].to(self.device),
                                            batch["action"].to(self.device), perturb=self._perturb(perturb_rng),
                                            speed=batch["speed"].to(self.device))
            loss = float(terms["total"])
            if not math.isfinite(loss):
                raise self._diverged("loss", loss, f"epoch {epoch + 1}, validation batch {index + 1}", self.val_set, batch)
            total += loss * len(batch["action"])
            count += len(batch["action"])
        return total / count

    def fit(self, resume: bool = False) -> TrainState:
        """Train into ``run_dir`` (continuing its latest checkpoint with ``resume``); returns the final state."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = latest_checkpoint(self.run_dir)
        if not resume and (checkpoint is not None or (self.run_dir / WEIGHTS_FILE).exists()):
            raise FileExistsError(f"{self.run_dir}: already holds a run; pass --resume or choose another --out")
        if checkpoint is not None:
            self.load_checkpoint(checkpoint)
        else:  # --resume on a run that never finished an epoch simply starts it
            self._start()
        remove_partial_files(self.run_dir)  # what a killed write left (one writer per run folder: the CLI holds its lock)
        try:
            return self._train_epochs()
        except Exception:
            if latest_checkpoint(self.run_dir) is None:
                self._abandon_start()
            raise

    def _abandon_start(self) -> None:
        """Remove what :meth:`_start` wrote for a run that failed before its first checkpoint, so no
        half-made run folder stays (a kill keeps it: ``--resume`` starts it again)."""
        for name in (CONFIG_FILE, VERSIONS_FILE, HISTORY_FILE):
            (self.run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(self.run_dir / "tensorboard", ignore_errors=True)
        shutil.rmtree(self.run_dir / RESUME_DIR, ignore_errors=True)

    def _train_epochs(self) -> TrainState:
        """Epochs until ``epochs`` or early stopping, a checkpoint after each."""
        cfg = self.config
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=self.state.epoch)
        try:
            while self.state.epoch < cfg.epochs and self.state.bad_epochs < cfg.early_stopping_patience:
                epoch = self.state.epoch
                start = time.perf_counter()
                record = self._run_epoch(epoch)
                self.scheduler.step(record["val_total"])
                record.update(epoch=epoch + 1, lr=self.optimizer.param_groups[0]["lr"], seconds=time.perf_counter() - start)
                for key, value in record.items():
                    if key != "epoch":
                        writer.add_scalar(key, value, epoch + 1)
                improved = record["val_total"] < self.state.best_val
                if improved:
                    self.state.best_val, self.state.bad_epochs = record["val_total"], 0
                else:
                    self.state.bad_epochs += 1
                self.state.history.append(record)
                self.state.epoch += 1
                self.save_checkpoint(improved)
                if self.progress:
                    tqdm.write(f"epoch {epoch + 1}: train {record['train_total']:.4f}  val {record['val_total']:.4f}  "
                               f"lr {record['lr']:.2e}  ({record['seconds']:.0f}s, {record['step_seconds']:.3f} s/step)")
        finally:
            writer.close()
        return self.state
