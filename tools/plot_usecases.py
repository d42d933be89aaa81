# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
"""Draws one plot `mpsteer usecases --plots DIR` describes: python3 plot_usecases.py SPEC.json OUT.png

SPEC: {"title", "xlabel", "ylabel", "kind": "lines" | "cdf", "series": [{"label", "x", "y"}]}.
"lines" draws y over x per series; "cdf" draws the empirical CDF of each series' y.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402


def main(spec_path, out_path):
    with open(spec_path) as f:
        spec = json.load(f)
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    for s in spec["series"]:
        if spec.get("kind") == "cdf":
            ys = sorted(s["y"])
            n = len(ys)
            ax.step(ys, [(i + 1) / n for i in range(n)], where="post", label=s["label"])
        else:
            ax.plot(s["x"], s["y"], label=s["label"], linewidth=1.4)
    ax.set_title(spec["title"], fontsize=10)
    ax.set_xlabel(spec["xlabel"])
    ax.set_ylabel("fraction of flows" if spec.get("kind") == "cdf" else spec["ylabel"])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_usecases.py SPEC.json OUT.png")
    main(sys.argv[1], sys.argv[2])
