#!/usr/bin/env python3
"""./zf demo's plot: per-step logs of each mode as one SVG of three panels.

  demo_plot.py --out=demo.svg [--start_val=LOSS] MODE=LOG.csv[,SUMMARY.out] ...

Panels, sharing the step axis: training loss (each step faint, smoothed over
a moving window bold) with validation points; exposed stall per step (ms);
step time (ms). The modes differ by colour, dash pattern and marker, and the
smoothed lines are drawn widest first, so a mode under another still shows
at its edges. Validation points: each mode's validation loss at its last
step (val_loss of the ZF_SUMMARY line in SUMMARY.out) and, with --start_val,
the pretrained model's at step 0 (the same for every mode): zf_train measures
validation once, after its last step.
The CSV is zf_train --log's: step,loss,step_ms,stall_ms,...
"""

import argparse
import csv
import json
import math
import sys

STYLES = [  # colour, dash, marker, smoothed line width (widest drawn first)
    ("#1f77b4", "", "circle", 4.5),
    ("#d62728", "7 4", "square", 3.0),
    ("#2ca02c", "2 3", "triangle", 2.0),
    ("#9467bd", "10 3 2 3", "diamond", 1.5),
]
W, PH, L, R, GAP, TOP = 900, 210, 70, 190, 58, 66


def read_log(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["step"]), float(r["loss"]), float(r["step_ms"]), float(r["stall_ms"])))
    return rows


def read_val(path):
    with open(path) as f:
        for line in f:
            if line.startswith("ZF_SUMMARY "):
                return float(json.loads(line[len("ZF_SUMMARY "):])["val_loss"])
    return None


def smooth(values, window):
    """Centred moving mean over `window` steps (shorter at the ends)."""
    out, h = [], window // 2
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    for i in range(len(values)):
        a, b = max(0, i - h), min(len(values), i + h + 1)
        out.append((prefix[b] - prefix[a]) / (b - a))
    return out


def nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    t = math.ceil(lo / step) * step
    ticks = []
    while t <= hi + 1e-9 * step:
        ticks.append(round(t, 10))
        t += step
    return ticks


def marker(kind, x, y, colour, size=6):
    if kind == "circle":
        return '<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s" stroke="black" stroke-width="1"/>' % (x, y, size, colour)
    if kind == "square":
        return '<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="black" stroke-width="1"/>' % (
            x - size, y - size, 2 * size, 2 * size, colour)
    if kind == "triangle":
        pts = [(x, y - size * 1.2), (x - size * 1.1, y + size * 0.8), (x + size * 1.1, y + size * 0.8)]
    else:  # diamond
        pts = [(x, y - size * 1.3), (x + size, y), (x, y + size * 1.3), (x - size, y)]
    return '<polygon points="%s" fill="%s" stroke="black" stroke-width="1"/>' % (
        " ".join("%.1f,%.1f" % p for p in pts), colour)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--start_val", type=float, default=None, help="validation loss at step 0")
    ap.add_argument("--window", type=int, default=0, help="smoothing window in steps (default: steps/16, at least 5)")
    ap.add_argument("modes", nargs="+", help="MODE=LOG.csv[,SUMMARY.out]")
    a = ap.parse_args()
    modes = []
    for spec in a.modes:
        name, _, files = spec.partition("=")
        log, _, summary = files.partition(",")
        rows = read_log(log)
        if not rows:
            sys.exit("demo_plot: %s has no steps" % log)
        modes.append((name, rows, read_val(summary) if summary else None))
    if len(modes) > len(STYLES):
        sys.exit("demo_plot: at most %d modes" % len(STYLES))
    max_step = max(r[-1][0] for _, r, _ in modes)
    window = a.window or max(5, max_step // 16)
    panels = [  # title, column, y from 0?
        ("training loss (faint: each step; bold: mean over %d steps); validation loss: markers" % window, 1, False),
        ("exposed stall per step (ms): the time a step waited for the optimizer", 3, True),
        ("step time (ms)", 2, True),
    ]
    height = TOP + len(panels) * (PH + GAP) + 20
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
           % (L + W + R, height), '<rect width="100%" height="100%" fill="white"/>']
    svg.append('<text x="%d" y="22" font-size="16" font-weight="bold">./zf demo: %s, %d steps</text>'
               % (L, " vs ".join(m[0] for m in modes), max_step))

    # Legend: each mode's line (colour, dash) and validation marker.
    lx = L
    for i, (name, _, _) in enumerate(modes):
        colour, dash, mk, _ = STYLES[i]
        svg.append('<line x1="%d" x2="%d" y1="44" y2="44" stroke="%s" stroke-width="3"%s/>'
                   % (lx, lx + 40, colour, ' stroke-dasharray="%s"' % dash if dash else ""))
        svg.append(marker(mk, lx + 52, 44, colour, 5))
        svg.append('<text x="%d" y="48" font-size="13">%s</text>' % (lx + 64, name))
        lx += 64 + 9 * len(name) + 30

    def x_of(step):
        return L + (step / max_step if max_step else 0) * W

    for p, (title, col, from_zero) in enumerate(panels):
        y0 = TOP + p * (PH + GAP) + 16
        series = [(name, [r[0] for r in rows], [r[col] for r in rows]) for name, rows, _ in modes]
        lo = 0.0 if from_zero else min(min(v) for _, _, v in series)
        hi = max(max(v) for _, _, v in series)
        if p == 0:
            vals = [v for _, _, v in modes if v is not None] + ([a.start_val] if a.start_val is not None else [])
            lo, hi = min([lo] + vals), max([hi] + vals)
            # The raw loss is noisy: fit the axis to the smoothed lines and the
            # validation points, with room for some of the noise.
            sm = [smooth(v, window) for _, _, v in series]
            lo = min([min(s) for s in sm] + vals)
            hi = max([max(s) for s in sm] + vals)
            pad = (hi - lo) * 0.25 or 0.1
            lo, hi = lo - pad, hi + pad
        if hi <= lo:
            hi = lo + 1

        def y_of(v):
            v = min(max(v, lo), hi)
            return y0 + PH - (v - lo) / (hi - lo) * PH

        svg.append('<text x="%d" y="%d" font-size="13">%s</text>' % (L, y0 - 6, title))
        svg.append('<rect x="%d" y="%d" width="%d" height="%d" fill="#fcfcfc" stroke="#999"/>' % (L, y0, W, PH))
        for t in nice_ticks(lo, hi):
            y = y_of(t)
            svg.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/>' % (L, L + W, y, y))
            svg.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 5, y + 4, t))
        for t in nice_ticks(0, max_step, 8):
            svg.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%g</text>' % (x_of(t), y0 + PH + 14, t))
        # Faint per-step lines first, then the smoothed ones, widest first.
        order = sorted(range(len(series)), key=lambda i: -STYLES[i][3])
        for i in order:
            _, steps, vals = series[i]
            pts = " ".join("%.1f,%.1f" % (x_of(s), y_of(v)) for s, v in zip(steps, vals))
            svg.append('<polyline fill="none" stroke="%s" stroke-opacity="0.22" stroke-width="1" points="%s"/>'
                       % (STYLES[i][0], pts))
        for i in order:
            colour, dash, _, width = STYLES[i]
            _, steps, vals = series[i]
            pts = " ".join("%.1f,%.1f" % (x_of(s), y_of(v)) for s, v in zip(steps, smooth(vals, window)))
            svg.append('<polyline fill="none" stroke="%s" stroke-width="%.1f"%s stroke-linejoin="round" points="%s"/>'
                       % (colour, width, ' stroke-dasharray="%s"' % dash if dash else "", pts))
        if p == 0:
            if a.start_val is not None:
                svg.append(marker("diamond", x_of(0), y_of(a.start_val), "#444"))
                svg.append('<text x="%.1f" y="%.1f" fill="#444">validation, pretrained: %.4f</text>'
                           % (x_of(0) + 10, y_of(a.start_val) - 8, a.start_val))
            placed = []
            for i, (name, rows, val) in enumerate(modes):
                if val is None:
                    continue
                # Side by side at the last step (close values would hide each other).
                x, y = x_of(rows[-1][0]) + 10 * i, y_of(val)
                svg.append(marker(STYLES[i][2], x, y, STYLES[i][0]))
                ly = y + 4
                while any(abs(ly - q) < 14 for q in placed):  # labels of close points do not overlap
                    ly += 14
                placed.append(ly)
                svg.append('<text x="%.1f" y="%.1f" fill="%s">%s %.4f</text>' % (x_of(max_step) + 12 + 10 * len(modes), ly, STYLES[i][0], name, val))
    svg.append('<text x="%d" y="%d" text-anchor="middle">step</text>' % (L + W // 2, height - 6))
    svg.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(svg) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
