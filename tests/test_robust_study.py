"""The robust-recipe study's stages and tables, on constructed aggregates."""

from __future__ import annotations

import json

from bench import results
from bench.robust_study import CLEAN, eval_folder, laps_table, read_laps, stage_conditions
from nsacdrive.eval.protocol_config import DEVELOPMENT_FAMILIES, TEST_FAMILIES, ProtocolConfig


def test_the_stages_keep_development_and_test_families_apart():
    protocol = ProtocolConfig()
    development, no_presets = stage_conditions("development", protocol)
    test, presets = stage_conditions("test", protocol)
    assert {c.rpartition("-")[0] for c in development} == set(DEVELOPMENT_FAMILIES) and no_presets == []
    assert {c.rpartition("-")[0] for c in test} == set(TEST_FAMILIES) - {"random"}
    assert presets == ["shift-3", "color-v0", "random"]
    assert {c.rpartition("-")[2] for c in development + test} == {"3", "5"}


def test_the_table_gives_laps_per_seed_and_pools_the_shifted_conditions(tmp_path):
    def aggregates(folder, rows):
        folder.mkdir(parents=True)
        (folder / "aggregates.json").write_text(json.dumps({"aggregates": [
            {"run": run, "corruption": corruption, "colour_preset": preset, "laps": laps, "episodes": 10, "score_mean": 900.0 + laps}
            for run, corruption, preset, laps in rows]}))
        return folder

    rows = [(f"nsac-s{s}", "none", "default", 10) for s in range(3)]
    rows += [(f"nsac-s{s}", "fog-3", "default", 5 + s) for s in range(3)]
    rows += [(f"nsac-s{s}", "none", "random", 9) for s in range(2)]  # seed 2 not driven yet
    laps = {"configs/a.json": read_laps([aggregates(tmp_path / "a", rows)])}
    table = laps_table("test", laps, ["nsac"], [0, 1, 2], [CLEAN, "random", "fog-3"])
    assert table["name"] == "Laps, test stage, training seeds 0, 1, 2: a (nsac)"  # one name per set of recipes, models and seeds
    assert table["columns"] == ["condition", "a, nsac"]
    assert table["rows"][0] == ["clean", "10 / 10 / 10 of 10, score 910 / 910 / 910"]  # the test stage's targets name a score
    assert table["rows"][1] == ["random", "9 / 9 / – of 10"]
    assert table["rows"][2] == ["fog-3", "5 / 6 / 7 of 10"]
    # seed 0: (9 + 5) / 20, seed 1: (9 + 6) / 20, seed 2: 7 / 10
    assert table["rows"][3][1] == "70 % / 75 % / 70 % (72 ± 2 %)"


def test_each_model_and_set_of_seeds_has_its_own_folder_and_each_set_its_table(tmp_path):
    assert eval_folder(tmp_path, "development", "nsac", [0], "corrupted") != eval_folder(tmp_path, "development", "nsac", [0, 1, 2], "corrupted")
    assert eval_folder(tmp_path, "development", "nsac", [0, 1, 2], "corrupted").name == "eval-development-nsac-seeds-0-2-corrupted"
    assert eval_folder(tmp_path, "test", "gmle", [0, 1, 5], "colours").name == "eval-test-gmle-seeds-0-1_5-colours"
    provenance = results.current_provenance(["python -m bench.robust_study"], [], [0], root=tmp_path)

    def table(name, cell):
        return {"name": name, "caption": "", "columns": ["condition", "a, nsac"], "rows": [["clean", cell]]}

    for name, cell in [("seeds 0-2", "1"), ("seeds 0", "2"), ("seeds 0-2", "3")]:
        path = results.put_table("robust-x", {**table(name, cell), "provenance": provenance}, root=tmp_path, title="X")
    tables = results.load_study(path, results.Layout.of(tmp_path))["tables"]
    assert [(t["name"], t["rows"][0][1]) for t in tables] == [("seeds 0", "2"), ("seeds 0-2", "3")]
