"""Merge a probe's tuning fragment into a package's tuning.json (first match wins there).

    python scripts/apply_tuning.py TUNING_JSON FRAGMENT_JSON [--arch sm90]

FRAGMENT_JSON is a list of {"match", "config"} entries or {"<arch>": [...]}. Each fragment entry
replaces an existing entry of the same arch with an identical "match" and otherwise goes in front
of that arch's list, so it wins over the broader entries. Keys starting with "_" in fragment
entries (notes such as "_measured") are dropped. The file keeps one entry per line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _key(entry: dict) -> str:
    return json.dumps(entry["match"], sort_keys=True)


def merge(table: dict, fragment: list[dict], arch: str) -> dict:
    frag = [{k: v for k, v in e.items() if not k.startswith("_")} for e in fragment]
    keys = {_key(e) for e in frag}
    table[arch] = frag + [e for e in table.get(arch, []) if _key(e) not in keys]
    return table


def dumps(table: dict) -> str:
    parts = []
    for k, v in table.items():
        if isinstance(v, list):
            body = "[\n" + ",\n".join("    " + json.dumps(e) for e in v) + "\n  ]"
        else:
            body = json.dumps(v)
        parts.append(f"  {json.dumps(k)}: {body}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tuning", type=Path)
    ap.add_argument("fragment", type=Path)
    ap.add_argument("--arch", default="sm90")
    args = ap.parse_args(argv)
    frag = json.loads(args.fragment.read_text())
    if isinstance(frag, dict):
        frag = frag.get(args.arch, [])
    table = merge(json.loads(args.tuning.read_text()), frag, args.arch)
    args.tuning.write_text(dumps(table))
    print(f"{args.tuning}: {len(frag)} {args.arch} entries merged ({len(table[args.arch])} in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
