"""``manifest.json``: the table of contents of a dataset folder, rebuilt from the sidecars.

Sidecars are the source of truth (each is written atomically after its episode file), so the
manifest can always be regenerated; it is rewritten atomically after every finished episode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nsacdrive.common.atomic import atomic_write_json
from nsacdrive.common.versions import current_versions
from nsacdrive.data_collection.episode import EpisodeFileError, read_sidecar

MANIFEST_NAME = "manifest.json"
MANIFEST_FIELDS = ("episode_id", "file", "track_seed", "colour_preset", "source", "agent_spec",
                   "n_steps", "total_reward", "lap_finished", "termination_reason", "noise")


def sidecar_paths(folder: Path) -> list[Path]:
    """Every episode sidecar in ``folder`` (sorted; the manifest itself excluded)."""
    return sorted(p for p in Path(folder).glob("*.json") if p.name != MANIFEST_NAME and not p.name.startswith("."))


def build_manifest(folder: Path) -> dict[str, Any]:
    entries, unreadable = [], []
    for path in sidecar_paths(folder):
        try:
            sidecar = read_sidecar(path)
        except EpisodeFileError as exc:
            unreadable.append(str(exc))
            continue
        entries.append({key: sidecar.get(key) for key in MANIFEST_FIELDS})
    return {
        "n_episodes": len(entries),
        "n_steps": sum(int(e["n_steps"]) for e in entries),
        "episodes": entries,
        "unreadable_sidecars": unreadable,
        "versions": current_versions(),  # of the nsacdrive that last wrote the folder (nsacdrive.common.versions)
    }


def write_manifest(folder: Path) -> dict[str, Any]:
    manifest = build_manifest(folder)
    atomic_write_json(Path(folder) / MANIFEST_NAME, manifest)
    return manifest
