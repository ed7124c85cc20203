"""Seed lists on the command line: ``"0-49"``, ``"42,1000-1009"``."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

#: the most seeds one list may name: far beyond any study, far below what a list of ints costs to hold
MAX_SEEDS = 1_000_000
#: the largest seed: numpy's and gymnasium's seeding and the 32-bit derived streams take any seed up to it
MAX_SEED = 2**32 - 1


def parse_seeds(text: str, argument: str = "--seeds") -> list[int]:
    """Parse comma-separated seeds and inclusive ranges; order kept, duplicates rejected, at most
    :data:`MAX_SEEDS` seeds of at most :data:`MAX_SEED` (checked before any range is expanded)."""
    seeds: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        match = re.fullmatch(r"(\d{1,20})(?:\s*-\s*(\d{1,20}))?", part)
        if not match:
            raise ValueError(f"{argument}: cannot parse {part[:40]!r} in {text[:80]!r}; expected e.g. '0-49' or '42,1000-1009'")
        start = int(match.group(1))
        stop = int(match.group(2)) if match.group(2) is not None else start
        if stop < start:
            raise ValueError(f"{argument}: range {part!r} runs backwards")
        if stop > MAX_SEED:
            raise ValueError(f"{argument}: seed {stop} in {part!r} is above the largest seed, {MAX_SEED}")
        if len(seeds) + stop - start + 1 > MAX_SEEDS:
            raise ValueError(f"{argument}: {text[:80]!r} names more than {MAX_SEEDS:,} seeds; give fewer")
        seeds.extend(range(start, stop + 1))
    duplicates = sorted(seed for seed, times in Counter(seeds).items() if times > 1)  # linear in the seeds
    if duplicates:
        raise ValueError(f"{argument}: seeds listed twice: {duplicates[:10]}")
    return seeds


def format_seeds(seeds: list[int] | set[int]) -> str:
    """Compact inverse of :func:`parse_seeds` (sorted): ``[0,1,2,5]`` → ``"0-2,5"``."""
    ordered = sorted(set(int(s) for s in seeds))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def derive_seed(*keys: int) -> int:
    """One 32-bit seed from several integers (``numpy.random.SeedSequence``): independent streams
    for (seed, epoch), (track, repeat) and the like."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0])
