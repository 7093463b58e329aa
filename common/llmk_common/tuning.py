"""Per-architecture tuning tables shipped as JSON inside each package.

A table maps an arch key (``sm90``, ``sm86``, ``cpu`` ...) to a list of entries.
Each entry has a ``match`` dict (exact values, or ``[lo, hi]`` inclusive ranges for
numbers) and a ``config`` dict. The first matching entry wins, so tables list the
specific cases first and a catch-all (empty ``match``) last.

Arch lookup falls back to the nearest lower arch of the same major version, then to
the nearest lower arch overall, so an SM89 card uses the SM86 table and an SM100
card the SM90 one until someone tunes it.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import torch

_CAP: dict[int, tuple[int, int]] = {}


def capability(device: torch.device) -> tuple[int, int]:
    """CUDA compute capability of ``device``, cached per device index: get_device_capability costs
    microseconds, and it is asked on every op call (arch keys, the Gluon kernels' eligibility)."""
    i = device.index if device.index is not None else torch.cuda.current_device()
    cap = _CAP.get(i)
    if cap is None:
        cap = _CAP[i] = tuple(torch.cuda.get_device_capability(i))
    return cap


def arch_key(device: torch.device | None) -> str:
    if device is None or device.type != "cuda":
        return "cpu"
    major, minor = capability(device)
    return f"sm{major}{minor}"


def _arch_num(key: str) -> int:
    return int(key[2:]) if key.startswith("sm") and key[2:].isdigit() else -1


def _matches(match: dict[str, Any], key: dict[str, Any]) -> bool:
    for field, want in match.items():
        got = key.get(field)
        if isinstance(want, list) and len(want) == 2 and all(isinstance(w, (int, float)) for w in want):
            if got is None or not (want[0] <= got <= want[1]):
                return False
        elif got != want:
            return False
    return True


class TuningTable:
    def __init__(self, table: dict[str, list[dict[str, Any]]]):
        self.table = table
        self._memo: dict[tuple, dict[str, Any]] = {}  # lookup results: ops ask on every call

    @classmethod
    def from_json(cls, path: str | Path) -> TuningTable:
        return cls(_load(str(path)))

    def resolve_arch(self, arch: str) -> str:
        if arch in self.table:
            return arch
        if arch == "cpu":
            raise KeyError("tuning table has no 'cpu' entry")
        num = _arch_num(arch)
        gpu = sorted((k for k in self.table if _arch_num(k) > 0), key=_arch_num)
        same_major = [k for k in gpu if _arch_num(k) // 10 == num // 10 and _arch_num(k) <= num]
        lower = [k for k in gpu if _arch_num(k) <= num]
        for cands in (same_major, lower, gpu):
            if cands:
                return cands[-1] if cands is not gpu else cands[0]
        raise KeyError(f"tuning table has no entry usable for {arch}")

    def lookup(self, arch: str, **key: Any) -> dict[str, Any]:
        """The config of the first entry matching ``key`` (a fresh copy); memoized per table, so the
        linear scan runs once per distinct key."""
        memo_key = (arch, tuple(sorted(key.items())))
        cfg = self._memo.get(memo_key)
        if cfg is None:
            entries = self.table[self.resolve_arch(arch)]
            cfg = next((e["config"] for e in entries if _matches(e.get("match", {}), key)), None)
            if cfg is None:
                raise KeyError(f"no tuning entry for {arch} {key}")
            if len(self._memo) >= 4096:
                self._memo.clear()
            self._memo[memo_key] = cfg
        return dict(cfg)


@cache
def _load(path: str) -> dict[str, list[dict[str, Any]]]:
    with open(path) as f:
        return json.load(f)
