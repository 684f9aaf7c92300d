"""The ``muxflow-slo`` verdict: GPU-metric-only protection (the paper's SysMonitor + xCUDA, at
the executor's launch target 0.7 and made stricter, 0.65 / 0.6 / 0.5) against SLO-driven
protection (`sharing.slo_protection` in front of them) on the same traces.

The GPU-metric runs trace a frontier of (SLO violation minutes, oversold GPU): a lower xCUDA
target buys fewer violations with less offline throughput. For each SLO-driven run:

- *at equal violations*: the best oversold GPU of any GPU-metric run with no more violation
  minutes than it; ours wins if its oversold GPU is higher;
- *at equal oversold GPU*: the fewest violation minutes of any GPU-metric run with at least its
  oversold GPU; ours wins if it has fewer.

Totals: violation minutes summed over the traces, oversold GPU averaged over them (each trace's
eq. 3 value). An SLO violation minute is a (GPU, minute) whose latency exceeds the GPU's p99
SLO (`muxflow_experiments`: ``slo_factor`` x the Online-only latency at peak load, full clock).
"""

from __future__ import annotations

from typing import Any

GPU_METRIC_PREFIXES = ("MuxFlow-xCUDA-",)


def is_gpu_metric(name: str) -> bool:
    return name == "MuxFlow" or name.startswith(GPU_METRIC_PREFIXES)


def is_slo(name: str) -> bool:
    return name.startswith("MuxFlow-SLO")


def totals(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per policy: violation minutes summed over traces, mean oversold GPU, mean p99 / Online-only."""
    traces = result["results"]["traces"]
    out: dict[str, dict[str, float]] = {}
    for name in traces[0]["runs"]:
        runs = [t["runs"][name] for t in traces]
        oversold = [r["oversold_gpu"] for r in runs if r["oversold_gpu"] is not None]
        out[name] = {
            "violation_min": sum(r["slo_violation_min"] for r in runs),
            "oversold_gpu": sum(oversold) / len(oversold) if oversold else 0.0,
            "p99_norm": sum(r["latency_p99_norm"] for r in runs) / len(runs),
            "attainment": min(r["slo_attainment"] for r in runs if r["slo_attainment"] is not None),
        }
    return out


def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The Pareto-efficient (violation minutes, oversold GPU) points, by violations ascending:
    none has another with no more violations and at least as much oversold GPU."""
    best: list[tuple[float, float]] = []
    for v, o in sorted(points, key=lambda p: (p[0], -p[1])):
        if not best or o > best[-1][1]:
            best.append((v, o))
    return best


def _between(points: list[tuple[float, float]], x: float, i: int) -> float | None:
    """Linear interpolation of coordinate 1 - i at coordinate i = x along the frontier; None outside it."""
    for a, b in zip(points, points[1:], strict=False):
        lo, hi = sorted((a[i], b[i]))
        if lo <= x <= hi:
            if a[i] == b[i]:
                return min(a[1 - i], b[1 - i]) if i == 1 else max(a[1 - i], b[1 - i])
            f = (x - a[i]) / (b[i] - a[i])
            return a[1 - i] + f * (b[1 - i] - a[1 - i])
    if len(points) == 1 and points[0][i] == x:
        return points[0][1 - i]
    return None


def verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One verdict per SLO-driven run against the GPU-metric frontier (totals over the traces)."""
    tot = totals(result)
    metric = {n: v for n, v in tot.items() if is_gpu_metric(n)}
    front = frontier([(v["violation_min"], v["oversold_gpu"]) for v in metric.values()])
    out = []
    for name, ours in tot.items():
        if not is_slo(name):
            continue
        fewer = {n: v for n, v in metric.items() if v["violation_min"] <= ours["violation_min"]}
        best_at_equal_v = max(fewer.items(), key=lambda kv: kv[1]["oversold_gpu"], default=None)
        more = {n: v for n, v in metric.items() if v["oversold_gpu"] >= ours["oversold_gpu"]}
        best_at_equal_o = min(more.items(), key=lambda kv: kv[1]["violation_min"], default=None)
        out.append({
            "policy": name, **ours,
            "equal_violations": None if best_at_equal_v is None else {"policy": best_at_equal_v[0], **best_at_equal_v[1]},
            "more_oversold_at_equal_violations": best_at_equal_v is None or ours["oversold_gpu"] > best_at_equal_v[1]["oversold_gpu"],
            "equal_oversold": None if best_at_equal_o is None else {"policy": best_at_equal_o[0], **best_at_equal_o[1]},
            "fewer_violations_at_equal_oversold": best_at_equal_o is not None and ours["violation_min"] < best_at_equal_o[1]["violation_min"],
            # the GPU-metric frontier, linearly interpolated between its settings, at our point
            "frontier_oversold_at_our_violations": _between(front, ours["violation_min"], 0),
            "frontier_violations_at_our_oversold": _between(front, ours["oversold_gpu"], 1),
        })  # fmt: skip
    return out


def _f(x: float, digits: int = 3) -> str:
    return f"{x:,.{digits}f}"


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The table of totals and one sentence per SLO-driven run (report.md; `hivemux sim run` prints it)."""
    tot = totals(result)
    lines = ["| protection | policy | SLO violation minutes (sum over traces) | worst SLO attainment | oversold GPU (mean) | p99 / Online-only (mean) |",
             "|---|---|---|---|---|---|"]
    for name, v in tot.items():
        kind = "GPU metrics (paper)" if is_gpu_metric(name) else "SLO-driven (ours)" if is_slo(name) else "none"
        lines.append(f"| {kind} | {name} | {v['violation_min']:,.0f} | {100 * v['attainment']:.3f}% | {_f(v['oversold_gpu'])} | {_f(v['p99_norm'])} |")
    lines.append("")
    for v in verdicts(result):
        eq_v, eq_o = v["equal_violations"], v["equal_oversold"]
        a = (f"at equal violations ({v['violation_min']:,.0f} min or fewer) it gives "
             + (f"oversold GPU {_f(v['oversold_gpu'])} vs {_f(eq_v['oversold_gpu'])} for the best GPU-metric setting "
                f"({eq_v['policy']}, {eq_v['violation_min']:,.0f} min)" if eq_v else f"oversold GPU {_f(v['oversold_gpu'])}, "
                "and no GPU-metric setting reaches so few violations")
             + (": more" if v["more_oversold_at_equal_violations"] else ": not more"))
        b = (f"at equal oversold GPU ({_f(v['oversold_gpu'])} or more) it has {v['violation_min']:,.0f} violation minutes vs "
             + (f"{eq_o['violation_min']:,.0f} for {eq_o['policy']} (oversold {_f(eq_o['oversold_gpu'])})" if eq_o else "none: "
                "no GPU-metric setting gives as much oversold GPU")
             + (": fewer" if v["fewer_violations_at_equal_oversold"] else ""))
        fo, fv = v["frontier_oversold_at_our_violations"], v["frontier_violations_at_our_oversold"]
        c = ("; the GPU-metric frontier interpolated between its settings gives "
             + (f"oversold GPU {_f(fo)} at its {v['violation_min']:,.0f} violation minutes" if fo is not None else "no point at its violations")
             + " and " + (f"{fv:,.0f} violation minutes at its oversold GPU {_f(v['oversold_gpu'])}" if fv is not None
                          else "no point at its oversold GPU"))
        lines.append(f"- **{v['policy']}**: {a}; {b}{c}.")
    return lines


def slo_rows(result: dict[str, Any]) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    """(claim, section, paper, measured) rows for report.md and RESULTS.md, and notes."""
    tot = totals(result)
    rows = []
    for name in ("MuxFlow", *(n for n in tot if is_gpu_metric(n) and n != "MuxFlow"), *(n for n in tot if is_slo(n))):
        if name in tot:
            v = tot[name]
            rows.append((f"{name}: SLO violation minutes (sum over traces) / oversold GPU (mean)", "§4.1-4.3 (ours: issue 19)",
                         "GPU metrics only" if is_gpu_metric(name) else "n/a (not in the paper)",
                         f"{v['violation_min']:,.0f} min / {_f(v['oversold_gpu'])}"))
    for v in verdicts(result):
        eq_v = v["equal_violations"]
        rows.append((f"{v['policy']} gives more oversold GPU at equal (or fewer) violations", "ours", "n/a",
                     ("yes" if v["more_oversold_at_equal_violations"] else "no")
                     + (f" ({_f(v['oversold_gpu'])} vs {_f(eq_v['oversold_gpu'])}, {eq_v['policy']})" if eq_v else "")))
        eq_o = v["equal_oversold"]
        rows.append((f"{v['policy']} gives fewer violations at equal (or more) oversold GPU", "ours", "n/a",
                     ("yes" if v["fewer_violations_at_equal_oversold"] else "no")
                     + (f" ({v['violation_min']:,.0f} vs {eq_o['violation_min']:,.0f} min, {eq_o['policy']})" if eq_o else
                        " (no GPU-metric setting reaches its oversold GPU)")))
    for v in verdicts(result):
        fo, fv = v["frontier_oversold_at_our_violations"], v["frontier_violations_at_our_oversold"]
        rows.append((f"{v['policy']} vs the GPU-metric frontier (interpolated): oversold GPU at its violations / violations at its oversold GPU",
                     "ours", "n/a", f"{_f(v['oversold_gpu'])} vs {_f(fo) if fo is not None else 'n/a'} / "
                     f"{v['violation_min']:,.0f} vs {f'{fv:,.0f}' if fv is not None else 'n/a'} min"))
    notes = ["SLO-driven protection acts per GPU only where the measured p99 nears its SLO; lowering xCUDA's target "
             "throttles every offline job all the time. The simulator takes each one-minute latency as that minute's p99 "
             "(the world has no distribution within a minute) and applies a launch target through xCUDA's steady state "
             "(`sharing_modes.throttled_share`); an SM-share step restarts the job (30 s, as every share change)."]
    return rows, notes


def trace_lines(trace: dict[str, Any]) -> list[str]:
    out = ["| policy | SLO violation minutes | SLO attainment | Online-only's violation minutes | oversold GPU | SLO steps |",
           "|---|---|---|---|---|---|"]
    for name, r in trace["runs"].items():
        steps = ", ".join(f"{k} {v}" for k, v in r.get("slo_steps", {}).items() if v) or "—"
        out.append(f"| {name} | {r['slo_violation_min']:,.0f} | {100 * (r['slo_attainment'] or 0):.3f}% | "
                   f"{r['slo_violation_min_online_only']:,.0f} | {_f(r['oversold_gpu']) if r['oversold_gpu'] is not None else '—'} | {steps} |")
    return out
