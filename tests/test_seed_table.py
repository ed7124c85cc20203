"""bench/seed_table.py: closed-loop figures per training seed, matched across seeds by run path."""

from __future__ import annotations

import json
import math

import pytest

from bench.seed_table import COLUMNS, collect_rows, format_table, main, recipe_and_seed


def episode(run: str, track: int, lap: bool, score: float, lateral: float = 1.5, preset: str = "default") -> dict:
    return {"run": run, "model": "levy", "colour_preset": preset, "track_seed": track, "repeat": 0, "failed": False,
            "reason": "lap" if lap else "time_limit", "lap_finished": lap, "score": score,
            "mean_abs_lateral_error": lateral, "corruption": "none"}


def write_eval(folder, records: list[dict], **settings) -> None:
    (folder / "episodes").mkdir(parents=True)
    for k, record in enumerate(records):
        (folder / "episodes" / f"e{k:03d}.json").write_text(json.dumps(record))
    (folder / "aggregates.json").write_text(json.dumps({"aggregates": [], "throttle_cap": None, **settings}))


def test_the_seed_token_names_seed_and_recipe():
    assert recipe_and_seed("runs/ql/levy-s12") == ("runs/ql/levy", "12")
    assert recipe_and_seed("runs/qs-dagger-s2/runs/round-1") == ("runs/qs-dagger/runs/round-1", "2")
    assert recipe_and_seed("runs/front-sharp/run") == ("runs/front-sharp/run", "-")  # "-sharp" is not a seed


def test_laps_scores_and_lateral_error_per_seed_then_across_seeds(tmp_path):
    records = [episode("runs/a-s0", 42, True, 920.0, 1.0), episode("runs/a-s0", 1000, False, 500.0, 9.0),
               episode("runs/a-s1", 42, True, 924.0, 2.0), episode("runs/a-s1", 1000, True, 926.0, 4.0),
               episode("runs/a-s1", 42, False, 100.0, preset="shift-3")]
    write_eval(tmp_path / "e", records, pedal_caution=0.5)
    rows = collect_rows([tmp_path / "e"])
    default, shifted = rows
    assert (default.recipe, default.condition, default.seeds) == ("runs/a", "default", ("0", "1"))
    assert default.actions == "no throttle cap, pedal caution 0.5"
    assert default.laps == (0.5, 1.0) and default.episodes == (2, 2)
    assert default.scores == (710.0, 925.0)
    assert default.lateral == (1.0, 3.0)  # finished laps only: seed 0's time-out is left out
    assert shifted.seeds == ("1",) and shifted.laps == (0.0,) and math.isnan(shifted.lateral[0])
    table = format_table(rows)
    assert "| runs/a | default | no throttle cap, pedal caution 0.5 | 0, 1 | 50 / 100 | 75 ± 35 | 817.5 ± 152.0 | 2.00 ± 1.41 | 2 / 2 |" in table
    assert "| runs/a | shift-3 | no throttle cap, pedal caution 0.5 | 1 | 0 | 0 | 100.0 | – | 1 |" in table


def test_tracks_filter_keeps_only_the_named_track_seeds(tmp_path):
    write_eval(tmp_path / "e", [episode("runs/a-s0", 42, True, 920.0), episode("runs/a-s0", 1010, False, 300.0)])
    (row,) = collect_rows([tmp_path / "e"], tracks={1010})
    assert row.laps == (0.0,) and row.episodes == (1,)
    assert collect_rows([tmp_path / "e"], tracks={7}) == []


def test_a_folder_without_episodes_is_named_in_the_error(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "aggregates.json").write_text("{}")
    with pytest.raises(ValueError, match="no episode records"):
        collect_rows([tmp_path / "e"])


def test_results_writes_the_table_with_its_commands_configs_and_seeds(tmp_path, capsys):
    write_eval(tmp_path / "e", [episode("runs/a-s0", 42, True, 920.0), episode("runs/a-s2", 42, False, 300.0)])
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "r.json").write_text("{}")
    (tmp_path / "results").mkdir()
    main([str(tmp_path / "e"), "--results", "study", "--title", "A study", "--table", "Laps", "--caption", "Two seeds.", "--config", "configs/r.json",
          "--command", "nsacdrive eval runs/a-s0 runs/a-s2 --seeds 42"], root=tmp_path)
    (table,) = json.loads((tmp_path / "results" / "study.json").read_text())["tables"]
    assert (table["name"], table["caption"], table["columns"]) == ("Laps", "Two seeds.", list(COLUMNS))
    assert table["rows"] == [["runs/a", "default", "no throttle cap", "0, 2", "100 / 0", "50 ± 71", "610.0 ± 438.4", "1.50", "1 / 1"]]
    provenance = table["provenance"]
    assert provenance["command"][0] == "nsacdrive eval runs/a-s0 runs/a-s2 --seeds 42"
    assert provenance["command"][1].startswith("python -m bench.seed_table ") and "--command" not in provenance["command"][1]
    assert provenance["seeds"] == [0, 2] and list(provenance["config_sha256"]) == ["configs/r.json"]
    assert "wrote the table 'Laps'" in capsys.readouterr().out


def test_results_without_a_table_name_is_refused(tmp_path):
    write_eval(tmp_path / "e", [episode("runs/a-s0", 42, True, 920.0)])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "e"), "--results", "study"], root=tmp_path)
