"""Plots the measurements of bench/bench_cuda.py as SVG line charts, without dependencies.

    python bench/plot_bench.py RESULTS.jsonl OUT_PREFIX [--title TEXT]

RESULTS.jsonl holds one JSON object per measured shape (bench_cuda.py --jsonl, or the JSON lines
it prints). Writes OUT_PREFIX-forward.svg and OUT_PREFIX-backward.svg: one panel per (head dim,
mask), TFLOP/s against the sequence length N, for flashattn's kernels, its mma.sync (sm80)
kernels, its deterministic backward, and PyTorch's cuDNN and FLASH (FlashAttention-2) backends
measured in the same run.
"""
import argparse
import json
import math
from xml.sax.saxutils import escape

# (label, key in the rows, colour, dashed)
SERIES = {
    "forward": [("flashattn", "ours_fwd", "#1f77b4", False), ("flashattn sm80", "sm80_fwd", "#1f77b4", True),
                ("cuDNN", "cudnn_fwd", "#d62728", False), ("FLASH (FA2)", "flash_fwd", "#2ca02c", False)],
    "backward": [("flashattn", "ours_bwd", "#1f77b4", False), ("flashattn deterministic", "ours_bwd_det", "#9467bd", True),
                 ("flashattn sm80", "sm80_bwd", "#1f77b4", True), ("cuDNN", "cudnn_bwd", "#d62728", False),
                 ("FLASH (FA2)", "flash_bwd", "#2ca02c", False)],
}
PANEL_W, PANEL_H, MARGIN_L, MARGIN_B, MARGIN_T, GAP = 300, 210, 48, 36, 26, 22


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def panel(rows, series, x0, y0, y_max, title):
    """SVG elements of one panel whose plot area starts at (x0, y0)."""
    ns = sorted({r["n"] for r in rows})
    w, h = PANEL_W - MARGIN_L - 10, PANEL_H - MARGIN_B - MARGIN_T
    ox, oy = x0 + MARGIN_L, y0 + MARGIN_T + h
    px = lambda i: ox + (w * (i + 0.5) / len(ns))
    py = lambda v: oy - h * v / y_max
    out = [f'<text x="{ox + w / 2}" y="{y0 + 16}" text-anchor="middle" font-size="12">{escape(title)}</text>',
           f'<rect x="{ox}" y="{oy - h}" width="{w}" height="{h}" fill="none" stroke="#999"/>']
    step = 100 if y_max > 400 else 50
    for v in range(0, int(y_max) + 1, step):
        out.append(f'<line x1="{ox}" x2="{ox + w}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{ox - 4}" y="{py(v) + 4:.1f}" text-anchor="end" font-size="10">{v}</text>')
    for i, n in enumerate(ns):
        label = f"{n // 1024}k" if n >= 1024 else str(n)
        out.append(f'<text x="{px(i):.1f}" y="{oy + 14}" text-anchor="middle" font-size="10">{label}</text>')
    by_n = {r["n"]: r for r in rows}
    for _, key, colour, dashed in series:
        points = [(px(i), py(by_n[n][key])) for i, n in enumerate(ns) if finite(by_n[n].get(key))]
        if not points:
            continue
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>' for x, y in points]
    return out


def chart(rows, pass_name, title):
    series = SERIES[pass_name]
    dims = sorted({r["d"] for r in rows})
    masks = [False, True]
    values = [r[k] for r in rows for _, k, _, _ in series if finite(r.get(k))]
    y_max = max(100, math.ceil(max(values, default=100) / 100) * 100)
    width = len(dims) * PANEL_W + GAP
    legend, x, y = [], GAP, 30 + len(masks) * PANEL_H + 14
    for label, _, colour, dashed in series:
        if x + 34 + 7 * len(label) > width:
            x, y = GAP, y + 18
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        legend.append(f'<line x1="{x}" x2="{x + 24}" y1="{y - 4}" y2="{y - 4}" stroke="{colour}" stroke-width="2"{dash}/>')
        legend.append(f'<text x="{x + 30}" y="{y}" font-size="11">{escape(label)}</text>')
        x += 44 + 6 * len(label)
    height = y + 12
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for col, d in enumerate(dims):
        for row, causal in enumerate(masks):
            cell = [r for r in rows if r["d"] == d and r["causal"] == causal]
            if cell:
                name = f"d = {d}, {'causal' if causal else 'non-causal'}"
                out += panel(cell, series, col * PANEL_W + GAP / 2, 30 + row * PANEL_H, y_max, name)
    out += legend
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("out_prefix")
    ap.add_argument("--title", default="flashattn beside PyTorch's SDPA backends")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.results) if line.startswith("{")]
    for pass_name in ("forward", "backward"):
        with open(f"{args.out_prefix}-{pass_name}.svg", "w") as f:
            f.write(chart(rows, pass_name, f"{args.title}: {pass_name}, TFLOP/s against N"))


if __name__ == "__main__":
    main()
