"""Ratio plots (anchor time / impl time per case, > 1 = faster than the anchor), one PNG per suite."""

from __future__ import annotations

import json
from pathlib import Path


def ratio_plots(json_path: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(json_path).read_text())
    env = data["env"]
    by_suite: dict[str, list[dict]] = {}
    for r in data["records"]:
        if r["ratio_vs_anchor"] is not None:
            by_suite.setdefault(r["suite"], []).append(r)
    out = []
    for suite, recs in by_suite.items():
        cases = list(dict.fromkeys(r["case"] for r in recs))
        impls = list(dict.fromkeys(r["impl"] for r in recs))
        anchors = sorted({r["anchor"] for r in recs})
        width = 0.8 / max(len(impls), 1)
        fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(cases) * max(1, len(impls)) ** 0.5 + 3), 4.5))
        for i, impl in enumerate(impls):
            xs, ys = [], []
            for j, case in enumerate(cases):
                for r in recs:
                    if r["case"] == case and r["impl"] == impl:
                        xs.append(j + (i - (len(impls) - 1) / 2) * width)
                        ys.append(r["ratio_vs_anchor"])
            ax.bar(xs, ys, width=width, label=impl)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(cases, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(f"speed vs {', '.join(anchors)} (x)")
        title = f"{suite}: {env.get('gpu') or 'CPU smoke'} | torch {env.get('torch')} | triton {env.get('triton')}"
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = Path(json_path).with_name(f"{Path(json_path).stem}-{suite}.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(p)
    return out
