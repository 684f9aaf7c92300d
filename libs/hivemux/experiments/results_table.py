"""One table of every scenario's measured figures beside the papers', for the README's
"Results" section: ``hivemux sim results --out DIR`` runs (or reuses) each scenario's
``results.json`` and writes ``DIR/RESULTS.md`` from the same rows each ``report.md`` shows."""

from __future__ import annotations

from typing import Any

from .muxflow_report import scenario_rows as muxflow_rows
from .report import _binding_rows, _sharing_rows

Row = tuple[str, str, str, str]


def salus_rows(result: dict[str, Any]) -> list[Row]:
    from .salus_experiments import PAPER_TABLE2

    pol = result["results"]["policies"]
    rows: list[Row] = [
        (f"{n}: avg JCT (min)", "§5.1, Table 2", f"{PAPER_TABLE2[n][2]}", f"{pol[n]['avg_jct_min']:,.1f}") for n in pol
    ]
    fifo, srtf = pol["FIFO"]["avg_jct_min"], pol["SRTF"]["avg_jct_min"]
    rows.append(("SRTF vs FIFO average JCT", "§5.1, Table 2", "3.19×", f"{fifo / srtf:.2f}×" if srtf else "n/a"))
    return rows


def scenario_table_rows(result: dict[str, Any]) -> list[Row]:
    name = result["scenario"]
    if name == "salus-policies":
        return salus_rows(result)
    if name == "salus-lanes":
        from .salus_lanes import table_rows

        return table_rows(result)
    if name.startswith("muxflow-"):
        return muxflow_rows(result)[0]
    rows: list[Row] = []
    if name in ("hived-anomaly-sweep", "hived-anomaly-causes"):
        for p in result["results"]["points"]:
            q, h = p["quota"], p["hived"]
            rows.append((f"worst excess over private, Quota / HiveD — {p['label']}", "§5.2, Fig. 6-8", "Quota > 0, HiveD none",
                         f"{q['max_excess_min']:,.0f} ({', '.join(q['anomalous_tenants']) or 'no anomaly'}) / "
                         f"{h['max_excess_min']:,.0f} ({', '.join(h['anomalous_tenants']) or 'no anomaly'})"))
        return rows
    if name == "hived-sharing-safety-seeds":
        import statistics

        for w in result["results"]["workloads"]:
            runs = [r["figures"] for r in w["runs"]]
            q = [r["quota_peak"] for r in runs]
            rows.append((f"Quota anomaly / largest 12-h window excess (min), median [range] over {len(runs)} seeds — {w['label']}",
                         "§5.2, Fig. 6-7", "yes / 200-8,000 min",
                         f"{sum(1 for r in runs if r['quota_anomalous'])} of {len(runs)} seeds / {statistics.median(q):,.0f} [{min(q):,.0f}-{max(q):,.0f}]"))
            rows.append((f"HiveD anomaly; HiveD < Quota (tenants, median) — {w['label']}", "§5.2, Fig. 7", "none; 9 of 11",
                         f"{sum(1 for r in runs if r['hived_anomalous'])} of {len(runs)} seeds; "
                         f"{statistics.median(r['hived_ahead'] for r in runs):g} of 11"))
        return rows
    for entry in result["results"]["workloads"]:
        got = _sharing_rows(entry)[0] if name.startswith("hived-sharing-safety") else _binding_rows(entry)[0]
        rows += [(f"{claim} — {entry['label']}", section, paper, measured) for claim, section, paper, measured in got]
    return rows


def results_markdown(results: list[dict[str, Any]]) -> str:
    out = ["| scenario | claim | paper section | paper | measured |", "|---|---|---|---|---|"]
    for result in results:
        for claim, section, paper, measured in scenario_table_rows(result):
            out.append(f"| `{result['scenario']}` | {claim} | {section} | {paper} | {measured} |")
    walls = ", ".join(f"`{r['scenario']}` {r['wall_time_s']:.0f} s" for r in results if r.get("wall_time_s") is not None)
    seeds = sorted({r["seed"] for r in results})
    return "\n".join(out) + f"\n\nSeed {', '.join(map(str, seeds))}; wall time per scenario on this machine: {walls or 'n/a'}.\n"
