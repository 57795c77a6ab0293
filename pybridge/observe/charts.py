"""The report's charts (PNG and SVG) and its HTML page, from `report.analyze`'s dict.

- timeline: a few steps (default 3, the last every rank took) of every rank, on the merged
  clock: one band per rank with its steps, the program's spans colored by category,
  the backward pass, the reducer's buckets and the collectives as thinner bars;
- breakdown: each rank's mean step as stacked bars (compute, exposed communication, data);
- bandwidth: bus bandwidth against message size per collective, log-log, with the link's
  limit as a line when it is given.

matplotlib (Agg, files only) is imported when a chart is drawn, so the report without
charts, and `write_html` for it, need nothing but the standard library.
"""

import base64
import html
import os

from ..errors import InvalidArgument
from . import report as _report
from . import tracks

COLORS = {"compute": "#dbe9f6", "forward": "#3a7dc9", "user": "#7fb2e5", "backward": "#1f4e8c",
          "data": "#f28e2b", "comm": "#e15759", "bucket": "#b07aa1", "collective": "#59a14f",
          "other": "#9c9c9c", "exposed": "#e15759"}
# the collectives in greens, teals and browns: apart from the spans' blues, orange and red
OP_COLORS = {"all_reduce": "#59a14f", "all_gather": "#76b7b2", "reduce_scatter": "#8cd17d",
             "broadcast": "#9c755f", "all_to_all": "#499894", "reduce": "#b6992d", "buckets": "#b07aa1"}
NAMES = ("timeline", "breakdown", "bandwidth")


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise InvalidArgument("the charts need matplotlib (pip install 'pybridge[plot]'); "
                              "--no-charts writes the report without them") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"svg.hashsalt": "pybridge", "svg.fonttype": "none", "font.size": 9,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _save(plt, fig, out, name):
    """fig as out/name.png and out/name.svg; returns {"png": path, "svg": path}."""
    paths = {}
    for ext in ("png", "svg"):
        path = os.path.join(out, f"{name}.{ext}")
        fig.savefig(path, dpi=110 if ext == "png" else None, metadata={"Date": None} if ext == "svg" else None,
                    bbox_inches="tight")
        paths[ext] = path
    plt.close(fig)
    return paths


# ---- timeline -------------------------------------------------------------------------

def _category(e):
    cat = e.get("cat")
    if cat in ("forward", "data", "comm"):
        return cat
    if cat in ("user", "compute"):
        return "user"
    return "other"


def timeline_data(events, ranks, steps=3):
    """What the timeline draws: the last `steps` steps every rank took, and per rank the
    spans that overlap them (ms from the window's start)."""
    per = {r: {} for r in ranks}
    for e in events:
        if e.get("ph") == "X" and e.get("tid") == tracks.STEPS and e.get("name") == "step" \
                and e.get("pid") in per:
            per[e["pid"]][int((e.get("args") or {}).get("step", 0))] = (e["ts"], e["ts"] + e["dur"])
    common = sorted(set.intersection(*(set(v) for v in per.values()))) if per else []
    chosen = common[-steps:] if steps > 0 else []
    if not chosen:
        return None
    t0 = min(per[r][n][0] for r in ranks for n in chosen)
    t1 = max(per[r][n][1] for r in ranks for n in chosen)
    lanes = {r: {"steps": [(n, (per[r][n][0] - t0) / 1e3, (per[r][n][1] - per[r][n][0]) / 1e3) for n in chosen],
                 "program": [], "backward": [], "buckets": [], "collectives": []} for r in ranks}
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in lanes or e.get("tid") == tracks.STEPS:
            continue
        start, dur = e.get("ts", 0.0), e.get("dur", 0.0)
        if start + dur < t0 or start > t1:
            continue
        bar = ((start - t0) / 1e3, dur / 1e3)
        tid, lane = e.get("tid"), lanes[e["pid"]]
        if tid == tracks.PROGRAM:
            lane["program"].append((bar, _category(e), e.get("name")))
        elif tid == tracks.BACKWARD:
            lane["backward"].append(bar)
        elif tid == tracks.BUCKETS:
            lane["buckets"].append(bar)
        elif isinstance(tid, int) and tid >= tracks.FIRST_COLLECTIVES:
            lane["collectives"].append((bar, e.get("name")))
    return {"steps": chosen, "span_ms": (t1 - t0) / 1e3, "lanes": lanes}


def timeline(rep, out, steps=3, events=None):
    plt = _plt()
    from matplotlib.patches import Patch
    if events is None:
        events = _report.load_merged(rep["trace"])[0]
    ranks = rep["ranks"]
    data = timeline_data(events, ranks, steps)
    height = max(2.6, 0.55 * len(ranks) + 1.6) if len(ranks) > 8 else 1.0 * len(ranks) + 1.6
    fig, ax = plt.subplots(figsize=(13, height))
    if data is None:
        ax.text(0.5, 0.5, "no step that every rank took", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return _save(plt, fig, out, "timeline")
    slow = rep["verdict"].get("straggler")
    for i, r in enumerate(ranks):
        lane, y = data["lanes"][r], i
        steps_bars = [(s, d) for _, s, d in lane["steps"]]
        ax.broken_barh(steps_bars, (y + 0.04, 0.42), facecolors=COLORS["compute"], edgecolors="#9bbbd9", linewidth=0.6)
        for n, s, d in lane["steps"]:
            ax.text(s + d / 2, y + 0.02, f"step {n}", ha="center", va="bottom", fontsize=7, color="#555")
        # longest first, so a nested span stays visible on top of the one that holds it
        for (s, d), cat, _ in sorted(lane["program"], key=lambda b: -b[0][1]):
            ax.broken_barh([(s, max(d, data["span_ms"] * 1e-4))], (y + 0.10, 0.34), facecolors=COLORS[cat])
        ax.broken_barh(lane["backward"], (y + 0.48, 0.08), facecolors=COLORS["backward"])
        ax.broken_barh(lane["buckets"], (y + 0.60, 0.10), facecolors=COLORS["bucket"])
        for (s, d), op in lane["collectives"]:
            ax.broken_barh([(s, max(d, data["span_ms"] * 1e-4))], (y + 0.74, 0.10),
                           facecolors=OP_COLORS.get(op, COLORS["collective"]))
        ax.axhline(y + 0.95, color="#e4e4e4", linewidth=0.8)
    ax.set_yticks([i + 0.45 for i in range(len(ranks))])
    ax.set_yticklabels([f"rank {r}" + (" (straggler)" if r == slow else "") for r in ranks])
    for label, r in zip(ax.get_yticklabels(), ranks):
        if r == slow:
            label.set_color("#c0392b")
            label.set_fontweight("bold")
    ax.set_ylim(len(ranks) - 0.02, -0.06)
    ax.set_xlim(0, data["span_ms"] * 1.005)
    ax.set_xlabel("ms (every rank on rank 0's clock)")
    ax.set_title(f"Timeline of steps {data['steps'][0]}-{data['steps'][-1]}: program spans (thick), "
                 "backward, buckets and collectives (thin)", loc="left")
    ops = sorted({op for r in ranks for _, op in data["lanes"][r]["collectives"]})
    handles = [Patch(color=COLORS[k], label=v) for k, v in
               (("compute", "compute (no span)"), ("forward", "forward"), ("user", "compute / user span"),
                ("data", "data wait"), ("comm", "comm wait (exposed)"), ("backward", "backward (grads ready)"),
                ("bucket", "reducer bucket"))]
    handles += [Patch(color=OP_COLORS.get(op, COLORS["collective"]), label=op) for op in ops]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.25)
    return _save(plt, fig, out, "timeline")


# ---- breakdown and bandwidth ------------------------------------------------------------------

def breakdown(rep, out):
    plt = _plt()
    rows = rep["per_rank"]
    slow = rep["verdict"].get("straggler")
    fig, ax = plt.subplots(figsize=(9, max(2.2, 0.42 * len(rows) + 1.3)))
    ys = range(len(rows))
    left = [0.0] * len(rows)
    for key, label, color in (("compute_ms", "compute", COLORS["forward"]),
                              ("exposed_comm_ms", "exposed communication", COLORS["exposed"]),
                              ("data_ms", "data wait", COLORS["data"])):
        widths = [x[key] for x in rows]
        ax.barh(ys, widths, left=left, color=color, label=label, height=0.62)
        left = [a + b for a, b in zip(left, widths)]
    for y, x in zip(ys, rows):
        ax.text(left[y], y, f"  {x['step_ms']:.2f} ms", va="center", fontsize=8, color="#333")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([f"rank {x['rank']}" + (" (straggler)" if x["rank"] == slow else "") for x in rows])
    for label, x in zip(ax.get_yticklabels(), rows):
        if x["rank"] == slow:
            label.set_color("#c0392b")
            label.set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xlim(0, max(left + [1e-3]) * 1.18)
    ax.set_xlabel("ms per step (mean)")
    ax.set_title("Where each rank's step goes", loc="left")
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, frameon=False, fontsize=8)
    ax.grid(axis="x", alpha=0.25)
    return _save(plt, fig, out, "breakdown")


def bandwidth(rep, out, link_gbps=None):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.4))
    series = {}
    for x in rep["bandwidth"]:
        series.setdefault(f"{x['op']} ({x['ranks']} ranks)", (x["op"], []))[1].append((x["size_class"], x["busbw_GBps"]))
    if rep["buckets"]:
        series["reducer buckets (as all_reduce)"] = ("buckets", [(x["bytes"], x["busbw_GBps"]) for x in rep["buckets"]])
    drawn = False
    for label, (op, pts) in sorted(series.items()):
        pts = sorted(p for p in pts if p[1] > 0)
        if not pts:
            continue
        drawn = True
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if op != "buckets" else "s", ms=4,
                linestyle="-" if op != "buckets" else ":", label=label, color=OP_COLORS.get(op))
    if link_gbps:
        ax.axhline(link_gbps, color="#c0392b", linestyle="--", linewidth=1)
        ax.text(0.99, link_gbps, f"link limit {link_gbps:g} GB/s", color="#c0392b", ha="right", va="bottom",
                fontsize=8, transform=ax.get_yaxis_transform())
    if drawn or link_gbps:
        from matplotlib.ticker import FuncFormatter, LogLocator
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=4))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _report.size_label(int(round(v))) if v >= 1 else ""))
    if not drawn:
        ax.text(0.5, 0.5, "no collective with a payload was recorded", ha="center", va="center",
                transform=ax.transAxes)
    else:
        ax.legend(fontsize=8, frameon=False)
    ax.set_xlabel("message size class (bytes, powers of two)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("Bus bandwidth against message size (nccl-tests' busbw)", loc="left")
    ax.grid(alpha=0.3, which="major")
    return _save(plt, fig, out, "bandwidth")


def draw(rep, out, steps=3, link_gbps=None, events=None):
    """All three charts into `out`: {name: {"png": path, "svg": path}}."""
    os.makedirs(out, exist_ok=True)
    return {"timeline": timeline(rep, out, steps, events), "breakdown": breakdown(rep, out),
            "bandwidth": bandwidth(rep, out, link_gbps)}


# ---- the page ------------------------------------------------------------------------------

_CSS = """
body{font-family:-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:0;background:#f4f6f9;color:#1d2733}
header{background:#1d2b3a;color:#fff;padding:22px 36px}
header h1{margin:0 0 6px;font-size:22px;font-weight:600}
header p{margin:0;color:#c8d3df;font-size:13px}
main{max-width:1320px;margin:0 auto;padding:20px 36px 40px}
.verdict{padding:14px 18px;border-radius:8px;margin:6px 0 20px;font-size:15px;line-height:1.45;border-left:6px solid}
.verdict.slow{background:#fdecea;border-color:#c0392b}
.verdict.even{background:#e8f6ec;border-color:#2e8b57}
.note{background:#fff7e0;border-left:6px solid #e0a800;padding:10px 16px;border-radius:8px;font-size:13px}
section{background:#fff;border-radius:10px;box-shadow:0 1px 3px rgba(0,0,0,.08);padding:16px 22px;margin:0 0 20px}
h2{font-size:16px;margin:2px 0 12px;color:#23364a}
table{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums}
th{background:#eef2f7;text-align:right;padding:6px 10px;font-weight:600;border-bottom:2px solid #d5dde7}
td{text-align:right;padding:5px 10px;border-bottom:1px solid #edf0f4}
th.l,td.l{text-align:left}
tr.slow td{background:#fdecea;font-weight:600}
tbody tr:hover td{background:#f5f8fc}
.caption{color:#5b6b7c;font-size:12px;margin:8px 0 0}
img.chart{max-width:100%;height:auto;display:block;margin:4px 0}
.files{font-size:12px;color:#5b6b7c}
.files a{color:#2f6db5}
"""


def _html_table(headers, rows, slow_rank=None, rank_col=False):
    left = {i for i, h in enumerate(headers) if h in ("op", "hook")}
    head = "".join(f'<th class="l">{html.escape(h)}</th>' if i in left else f"<th>{html.escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for r in rows:
        cls = ' class="slow"' if rank_col and slow_rank is not None and r[0] == str(slow_rank) else ""
        cells = "".join(f'<td class="l">{html.escape(c)}</td>' if i in left else f"<td>{html.escape(c)}</td>"
                        for i, c in enumerate(r))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _embed(paths, out, alt):
    with open(paths["svg"], "rb") as f:
        data = base64.b64encode(f.read()).decode()
    links = " · ".join(f'<a href="{html.escape(os.path.relpath(paths[k], out))}">{k.upper()}</a>'
                       for k in ("png", "svg"))
    return (f'<img class="chart" alt="{html.escape(alt)}" src="data:image/svg+xml;base64,{data}">'
            f'<p class="files">{links}</p>')


def write_html(rep, out, charts=None):
    """out/report.html: the headline, the verdict, the charts (SVG embedded, so the page
    stands alone; the PNG and SVG files are linked) and the tables. Returns its path."""
    charts = charts or {}
    v = rep["verdict"]
    slow = v.get("straggler")
    parts = [f"<header><h1>pybridge report</h1><p>{html.escape(_report.headline(rep))}</p></header><main>",
             f'<div class="verdict {"slow" if slow is not None else "even"}"><b>Verdict.</b> '
             f"{html.escape(v['text'])}</div>"]
    first = rep.get("slow_first_step")
    if first:
        parts.append(f'<p class="note">Step 1 of rank {first["rank"]} took {first["step_ms"]:.1f} ms, '
                     f'{first["times_median"]:.0f}× the median step (start-up): '
                     "<code>--skip-steps 1</code> leaves it out of the means.</p>")
    titles = {"timeline": "Timeline", "breakdown": "Step breakdown", "bandwidth": "Bus bandwidth"}
    tabs = _report.tables(rep)
    order = [("chart", "timeline"), ("chart", "breakdown"), ("table", 0), ("chart", "bandwidth"), ("table", 1),
             ("table", 2), ("table", 3)]
    for kind, key in order:
        if kind == "chart":
            if key in charts:
                parts.append(f"<section><h2>{titles[key]}</h2>{_embed(charts[key], out, titles[key])}</section>")
            continue
        title, headers, rows, note = tabs[key]
        table = _html_table(headers, rows, slow, rank_col=headers[0] == "rank") if rows else "<p>(none recorded)</p>"
        parts.append(f"<section><h2>{html.escape(title)}</h2>{table}"
                     f'<p class="caption">{html.escape(note)}</p></section>')
    parts.append(f'<p class="files">Data: <a href="report.json">report.json</a> · trace: '
                 f"{html.escape(rep['trace'])} (open it in Perfetto or chrome://tracing)</p></main>")
    page = ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>pybridge report: {html.escape(os.path.basename(rep['directory']) or rep['directory'])}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path
