"""Progress output (common/progress.py): live bars on a terminal, a few whole lines in a log."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest
from data_fixtures import write_synthetic
from tqdm import tqdm

from nsacdrive.common.progress import LogLines, is_terminal, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_tqdms_live_bar():
    stream = Terminal()
    with progress_bar(total=5, desc="collect", unit="episode", file=stream, mininterval=0) as bar:
        for _ in range(5):
            bar.update(1)
    assert type(bar) is tqdm and is_terminal(stream)
    assert stream.getvalue().count("\r") >= 5  # redrawn in place


def test_a_log_gets_one_line_when_the_bar_ends_not_one_per_redraw():
    stream = io.StringIO()
    with progress_bar(total=1000, desc="collect", unit="episode", file=stream) as bar:
        for _ in range(1000):
            bar.update(1)
            bar.set_postfix(steps_per_s="120")  # asks for a redraw every time
    assert isinstance(bar, LogLines) and not is_terminal(stream)
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    assert stream.getvalue().splitlines() == [stream.getvalue().strip()]
    assert stream.getvalue().startswith("collect: 1000/1000 episode [") and "steps_per_s=120" in stream.getvalue()


def test_log_lines_come_at_most_once_per_interval():
    stream, interval = io.StringIO(), 0.05
    start = time.perf_counter()
    for _ in progress_bar(range(40), desc="importing", unit="row", file=stream, mininterval=interval):
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    lines = stream.getvalue().splitlines()
    assert 2 <= len(lines) <= elapsed / interval + 2
    assert lines[-1].startswith("importing: 40/40 row")


def test_bars_that_vanish_on_a_terminal_leave_nothing_in_a_log():
    stream = io.StringIO()
    outer = progress_bar(range(3), desc="dagger", unit="round", file=stream)
    for k in outer:
        with progress_bar(total=50, desc="epoch", unit="batch", file=stream, leave=False, position=1) as bar:
            bar.update(50)
        tqdm.write(f"round {k} done", file=stream)
    assert stream.getvalue().splitlines() == ["round 0 done", "round 1 done", "round 2 done", stream.getvalue().splitlines()[-1]]
    assert stream.getvalue().splitlines()[-1].startswith("dagger: 3/3 round")


def test_a_disabled_bar_prints_nothing():
    stream = io.StringIO()
    with progress_bar(total=3, file=stream, disable=True) as bar:
        bar.update(3)
    assert stream.getvalue() == ""


@pytest.mark.slow
def test_training_into_a_file_prints_about_one_line_per_epoch(tmp_path):
    for seed in (0, 1, 2):
        write_synthetic(tmp_path / "data", f"ep{seed}", 90, track_seed=seed, textured=False)
    epochs, batches = 3, 20
    config = {"data": str(tmp_path / "data"), "train_seeds": "0", "val_seeds": "1", "test_seeds": "2",
              "batch_size": 1, "epochs": epochs, "max_batches_per_epoch": batches, "max_val_batches": 1,
              "model": {"model": "gmle", "encoder": {"token_dim": 16, "channels": [8, 16, 16]},
                        "d_model": 16, "num_heads": 4, "topk": 4}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with open(tmp_path / "train.log", "w") as log:
        result = subprocess.run([sys.executable, "-m", "nsacdrive.cli", "train", "--config", tmp_path / "config.json",
                                 "--out", tmp_path / "run", "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT,
                                timeout=300)
    text = (tmp_path / "train.log").read_text()
    assert result.returncode == 0, text
    assert "\r" not in text
    lines = text.splitlines()
    assert sum(line.startswith("epoch ") for line in lines) == epochs
    assert len(lines) <= epochs + 3, text
    assert lines[-1].startswith(f"trained gmle for {epochs} epochs")


def test_the_ppo_progress_bar_is_off_when_output_is_not_a_terminal(tmp_path, capsys):
    from nsacdrive.agents.ppo import train_ppo
    from nsacdrive.agents.ppo_config import PPOConfig

    messages: list[str] = []
    config = PPOConfig.state_recipe(timesteps=256, n_envs=1, n_steps=256, batch_size=128, n_epochs=1, eval_freq=0,
                                    max_episode_steps=60, progress_bar=True)
    train_ppo(config, tmp_path / "ppo", log=messages.append)
    assert "progress bar off: output is not a terminal" in messages
    assert "\r" not in capsys.readouterr().out
