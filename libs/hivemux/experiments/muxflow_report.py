"""report.md and figures of the MuxFlow scenarios (``muxflow-testbed``, ``muxflow-related-work``,
``muxflow-ablation``): the measured figures beside the paper's, quoted from
``shared/papers/muxflow-2024-preprint.txt`` (and the journal version where it differs), with
the reasons where they disagree. Nothing here moves a measured number toward the paper.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BASELINES = ("Time-sharing", "PB-time-sharing", "PB-multi-stream")
ASSUMPTIONS = (
    "The online services, their latencies and the offline jobs' speeds are a model (`experiments/online_world.py`, "
    "`simulated/interference.py`, `experiments/sharing_modes.py`, each with its calibration); the paper's simulator replays "
    "more than 200 profiled executions of real pairs, which are not public.",
    "The offline traces are the Philly week's four largest virtual clusters, resampled to the paper's job counts "
    "(1,410-7,287) with durations scaled so their solo GPU time is `load` x the cluster's over the window, and "
    "capped; a multi-GPU job becomes independent one-GPU workers.",
    "Time-sharing, PB-time-sharing and PB-multi-stream are analytic models of those systems' sharing (the "
    "paper implements them in its simulator without giving formulas) and place jobs FCFS without SysMonitor, "
    "xCUDA or a slowdown bound.",
    "A running job's share follows the online load at each 15-minute round only when it moves by 5 points or more "
    "(each re-set restarts the job, charged 30 s like every start).",
)


def _f(x: Any, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


# -- rows: (claim, paper section, paper, measured) ------------------------------------------
def testbed_rows(result: dict[str, Any]) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    run = result["results"]["traces"][0]["runs"]["MuxFlow"]
    series = run["series"]["normalized_throughput"]
    peak = max(series) if series else None
    util = _ratio(run["gpu_util"], run["gpu_util_online_only"])
    sm = _ratio(run["sm_activity"], run["sm_activity_online_only"])
    mem = _ratio(run["memory_usage"], run["memory_usage_online_only"])
    rows = [
        ("Online average latency vs Online-only", "§7.2, Fig. 10", "+16.0% (journal +16.4%)", _pct(run["latency_avg_norm"] - 1)),
        ("Online p99 latency vs Online-only", "§7.2, Fig. 10", "+15.3% (journal +18.4%)", _pct(run["latency_p99_norm"] - 1)),
        ("GPU given to offline work (oversold GPU, eq. 3): peak / whole run", "§7.2", "up to 86.42% (journal 71.2%)",
         f"{_f(100 * peak, 1) if peak is not None else 'n/a'}% (10-min peak) / {_f(100 * (run['oversold_gpu'] or 0), 1)}%"),
        ("Offline executions evicted", "§7.2", "1.5%", f"{_f(100 * run['eviction_rate'], 2)}% ({run['evictions']} of {run['executions']})"),
        ("GPU utilization vs Online-only", "§7.2, Fig. 10", "4.0× (production: 26% → 76%)",
         f"{_f(util)}× ({_f(run['gpu_util_online_only'], 1)}% → {_f(run['gpu_util'], 1)}%)"),
        ("SM activity vs Online-only", "§7.2, Fig. 10", "4.7× (production: 16% → 33%)",
         f"{_f(sm)}× ({_f(run['sm_activity_online_only'], 1)}% → {_f(run['sm_activity'], 1)}%)"),
        ("GPU memory usage vs Online-only", "§7.2, Fig. 10", "1.5× (production: 42% → 48%)",
         f"{_f(mem)}× ({_f(run['memory_usage_online_only'], 1)}% → {_f(run['memory_usage'], 1)}%)"),
        ("Speed predictor error at placement (MAPE)", "§7.4, Fig. 12", "≈ 4-7% test error (Fig. 12)", f"{_f(100 * (run['predictor_mape'] or 0), 1)}%"),
    ]
    notes = []
    if run["latency_avg_norm"] - 1 < 0.10:
        notes.append(f"Online slowdown is smaller than the paper's (+{_f(100 * (run['latency_avg_norm'] - 1), 1)}% vs +16%): in our "
                     "model the slowdown under dynamic SM allocation is the interference term K_ON·q of the offline job's SM use "
                     "(calibrated on Figure 4's pair), and the time-weighted load here keeps q below the figure's pair on most "
                     "GPUs; clock drops add a little.")
    if util is not None and util < 3.0:
        notes.append(f"GPU utilization grows {_f(util)}×, SM activity {_f(sm)}×, not 4.0× / 4.7×: the ratios depend on how many "
                     "GPUs hold an offline job over time, i.e. on the offline load (`load` = "
                     f"{result['results']['params']['load']}) and the trace, which are ours; the production figure "
                     "(§7.5: 26% → 76%, 16% → 33%) is closer.")
    if run["eviction_rate"] < 0.005:
        notes.append(f"Fewer evictions than the paper's 1.5% ({_f(100 * run['eviction_rate'], 2)}%): only the 5% 'hot' online "
                     "GPUs reach SysMonitor's Overlimit thresholds (defaults in `health/default_health.yaml`), and the matcher "
                     "does not place on Unhealthy GPUs.")
    return rows, notes


def comparison_rows(result: dict[str, Any]) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    traces = result["results"]["traces"]
    names = list(traces[0]["runs"])
    rows: list[tuple[str, str, str, str]] = []
    notes: list[str] = []
    mux = [t["runs"]["MuxFlow"] for t in traces]
    worst_mux = max(r["latency_avg_norm"] for r in mux) - 1
    if any(b in names for b in BASELINES):
        jct = [_ratio(t["runs"][b]["avg_jct_min"], t["runs"]["MuxFlow"]["avg_jct_min"]) for t in traces for b in BASELINES if b in names]
        ovs = [_ratio(t["runs"]["MuxFlow"]["oversold_gpu"], t["runs"][b]["oversold_gpu"]) for t in traces for b in BASELINES if b in names]
        jct_v = [x for x in jct if x is not None]
        ovs_v = [x for x in ovs if x is not None]
        ts = max(t["runs"]["Time-sharing"]["latency_avg_norm"] for t in traces) - 1 if "Time-sharing" in names else None
        pb = max(t["runs"]["PB-time-sharing"]["latency_avg_norm"] for t in traces) - 1 if "PB-time-sharing" in names else None
        rows += [
            ("Average JCT: baseline / MuxFlow, over baselines and traces", "§7.3, Fig. 11", "1.10-2.24× (journal: up to 2.2×)",
             f"{_f(min(jct_v))}-{_f(max(jct_v))}×" if jct_v else "n/a"),
            ("Oversold GPU: MuxFlow / baseline", "§7.3, Fig. 11", "1.08-1.97× (journal: up to 2.0×)",
             f"{_f(min(ovs_v))}-{_f(max(ovs_v))}×" if ovs_v else "n/a"),
            ("MuxFlow's online slowdown (average latency, worst trace)", "§7.3", "< 20%", _pct(worst_mux)),
            ("Time-sharing's online slowdown (worst trace)", "§7.3", "up to 50%", _pct(ts)),
            ("PB-time-sharing's online slowdown (worst trace)", "§7.3", "protects online latency", _pct(pb)),
        ]
        if jct_v and min(jct_v) < 1.0:
            notes.append("Some baseline finishes jobs sooner on average than MuxFlow on some trace (JCT ratio below 1): "
                         "the baselines have no slowdown bound or SysMonitor gate and place every job at once on any GPU, "
                         "while MuxFlow refuses pairs predicted to slow the online service by more than 20% and waits.")
        if ovs_v and min(ovs_v) < 1.0:
            notes.append("Some baseline reaches a higher oversold GPU than MuxFlow on some trace: see the per-trace table; "
                         "PB-multi-stream here hands the offline job exactly the SMs the online kernels leave at each "
                         "instant (no window lag, no floor), an idealization of REEF/DeepPool.")
        if ts is not None and ts < 0.2:
            notes.append(f"Time-sharing slows online work by {_f(100 * ts, 1)}%, far below the paper's up to 50%: our time-slicing "
                         "model stretches only the kernel part of a request by the offline job's busy time, and online GPUs "
                         "here are lightly loaded most of the day.")
    ablation = [n for n in ("MuxFlow-S", "MuxFlow-M", "MuxFlow-S-M") if n in names]
    if len(ablation) == 3:
        def better(a: dict[str, Any], b: dict[str, Any]) -> bool:
            return (a["avg_jct_min"] or 1e18) < (b["avg_jct_min"] or 1e18) and (a["oversold_gpu"] or 0) > (b["oversold_gpu"] or 0)

        s_wins = sum(better(t["runs"]["MuxFlow-S"], t["runs"]["MuxFlow-S-M"]) for t in traces)
        m_wins = sum(better(t["runs"]["MuxFlow-M"], t["runs"]["MuxFlow-S-M"]) for t in traces)
        best = sum(all((t["runs"]["MuxFlow"]["avg_jct_min"] or 1e18) <= (t["runs"][n]["avg_jct_min"] or 1e18) for n in ablation) for t in traces)
        unfinished = {n: sum(t["runs"][n]["unfinished_jobs"] for t in traces) for n in ["MuxFlow", *ablation]}
        rows += [
            ("MuxFlow-S beats MuxFlow-S-M (JCT and oversold GPU)", "§7.4, Fig. 13", "yes, traces A-D", f"{s_wins} of {len(traces)} traces"),
            ("MuxFlow-M beats MuxFlow-S-M (JCT and oversold GPU)", "§7.4, Fig. 13", "yes, traces A-D", f"{m_wins} of {len(traces)} traces"),
            ("MuxFlow has the lowest average JCT", "§7.4, Fig. 13", "yes (\"brings more benefits\")", f"{best} of {len(traces)} traces"),
        ]
        if s_wins < len(traces):
            notes.append(f"MuxFlow-S (a fixed {result['results']['params']['fixed_share']:g}% share) does not beat MuxFlow-S-M on "
                         "every trace: with one GPU type and four offline families the matching has little to choose between "
                         f"(unfinished at the horizon: {unfinished}).")
        if m_wins < len(traces):
            notes.append("FCFS (MuxFlow-M) is close to matching here: with one GPU type and four offline model families the "
                         "pair weights differ by little (our interference model gives 7-21% between families, §7.4 of the "
                         "paper reports up to 50%), so the matching has little to gain.")
    return rows, notes


def scenario_rows(result: dict[str, Any]) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    if result["scenario"] == "muxflow-slo":
        from .slo_report import slo_rows

        return slo_rows(result)
    return testbed_rows(result) if result["scenario"] == "muxflow-testbed" else comparison_rows(result)


# -- report ---------------------------------------------------------------------------------
def _run_table(trace: dict[str, Any]) -> list[str]:
    mux = trace["runs"].get("MuxFlow")
    out = ["| system | avg latency / Online-only | p99 / Online-only | avg JCT (min) | JCT / MuxFlow | makespan (h) | oversold GPU | "
           "oversold / MuxFlow | GPU util. | SM activity | memory | evictions | unfinished |", "|" + "---|" * 13]
    for name, r in trace["runs"].items():
        placing = r["placement"] != "none"
        out.append(
            f"| {name} | {_f(r['latency_avg_norm'], 3)} | {_f(r['latency_p99_norm'], 3)} | {_f(r['avg_jct_min'], 1) if placing else '—'} | "
            f"{_f(_ratio(r['avg_jct_min'], mux['avg_jct_min'])) if placing and mux else '—'} | {_f(r['makespan_h'], 1) if placing else '—'} | "
            f"{_f(r['oversold_gpu'], 3) if placing else '—'} | {_f(_ratio(r['oversold_gpu'], mux['oversold_gpu'])) if placing and mux else '—'} | "
            f"{_f(r['gpu_util'], 1)}% | {_f(r['sm_activity'], 1)}% | {_f(r['memory_usage'], 1)}% | {r['evictions'] if placing else '—'} | "
            f"{r['unfinished_jobs'] if placing else '—'} |"
        )
    return out


def _plots(result: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = result["results"]["traces"]
    if result["scenario"] == "muxflow-testbed":
        s = traces[0]["runs"]["MuxFlow"]["series"]
        fig, axes = plt.subplots(1, 4, figsize=(14, 3))
        axes[0].plot(s["hour"], s["latency_norm"], color="#d62728")
        axes[0].axhline(1.0, color="grey", lw=0.8, ls="--")
        axes[0].set_title("online latency / Online-only", fontsize=8)
        axes[1].plot(s["hour"], s["normalized_throughput"], color="#1f77b4")
        axes[1].set_title("offline normalized throughput", fontsize=8)
        for ax, key, label in ((axes[2], "gpu_util", "GPU utilization %"), (axes[3], "sm_activity", "SM activity %")):
            ax.plot(s["hour"], s[key], label="MuxFlow")
            ax.plot(s["hour"], s[key + "0"], label="Online-only")
            ax.set_title(label, fontsize=8)
            ax.legend(fontsize=7)
        for ax in axes:
            ax.set_xlabel("hour", fontsize=8)
        fig.tight_layout()
        path = out / "testbed.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return [path]
    names = [n for n in traces[0]["runs"] if n != "Online-only"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.2))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [k + i * width for k in range(len(traces))]
        axes[0].bar(xs, [t["runs"][name]["latency_avg_norm"] for t in traces], width, label=name)
        axes[1].bar(xs, [_ratio(t["runs"][name]["avg_jct_min"], t["runs"]["MuxFlow"]["avg_jct_min"]) or 0 for t in traces], width)
        axes[2].bar(xs, [_ratio(t["runs"][name]["oversold_gpu"], t["runs"]["MuxFlow"]["oversold_gpu"]) or 0 for t in traces], width)
    for ax, title in zip(axes, ("online avg latency / Online-only", "avg JCT / MuxFlow", "oversold GPU / MuxFlow"), strict=True):
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(traces))], [f"trace {t['trace']}" for t in traces])
        ax.set_title(title, fontsize=8)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    path = out / f"{result['scenario'].removeprefix('muxflow-')}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def write_report(result: dict[str, Any], out: Path, wall_s: float | None = None) -> list[Path]:
    """report.md and the figure (results.json is written by ``sim.report``)."""
    r = result["results"]
    p = r["params"]
    pngs = _plots(result, out)
    rows, notes = scenario_rows(result)
    md = [f"# {result['scenario']} — {result['paper']}", "", result["description"] + ".", "",
          f"Seed {result['seed']}" + (f", wall time {wall_s:.1f} s" if wall_s is not None else "") + ". "
          f"Reproduce: `hivemux sim run --scenario {result['scenario']} --seed {result['seed']}` (add `--scale small`). "
          "Every metric and the configuration are in `results.json`.", "",
          f"Cluster: {p['gpus']} GPUs, each serving one online workload; offline traces {', '.join(p['traces'])} with "
          f"{p['job_counts']} jobs submitted over {p['hours']:g} h (load {p['load']}), run until done or {p['horizon_h']:g} h; "
          f"ticks of {p['tick_s']:g} s, scheduling rounds every {p['round_s']:g} s.", "",
          "## Paper vs measured", "",
          "| claim | paper section | paper | measured |", "|---|---|---|---|"]
    md += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    if result["scenario"] == "muxflow-slo":
        from .slo_report import summary_lines, trace_lines

        md += ["", "## SLO-driven vs GPU-metric-only protection (totals over the traces)", "", *summary_lines(result)]
    for t in r["traces"]:
        md += ["", f"## Trace {t['trace']}: {t['jobs']} jobs, {t['workers']} workers, {_f(t['solo_gpu_hours'], 0)} solo GPU-hours", "",
               f"Models {t['models']}; batch sizes (largest under the 40% memory quota) {t['batch_sizes']}.", ""]
        md += _run_table(t)
        if result["scenario"] == "muxflow-slo":
            md += ["", *trace_lines(t)]
    md += [""] + [f"![figure]({png.name})" for png in pngs]
    md += ["", "## Where we disagree with the paper, and why", ""]
    md += [f"- {n}" for n in notes] or ["- The measured directions agree with the paper on every row above."]
    md += [f"- {n}" for n in ASSUMPTIONS] + [""]
    (out / "report.md").write_text("\n".join(md))
    return [*pngs, out / "report.md"]
