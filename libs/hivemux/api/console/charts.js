// Charts over time, drawn as plain SVG. The read models keep each GPU's current state and its
// last metric-driven health sample, not a telemetry time series (the projector does not fold the
// 1 Hz telemetry), so these series are sampled by this console from the live state it holds:
// every SAMPLE_MS and kept in this tab's sessionStorage (a reload keeps them, a new tab starts
// empty). Each chart says what it is computed from.

import { fmtNum, h, replace } from "./dom.js";

const KEY = "hivemux.series";
const SAMPLE_MS = 5000;
const KEEP = 720; // one hour at 5 s

export const SERIES = [
  { key: "gpu_util", title: "GPU utilization", unit: "%", from: "mean gpu_util of each GPU's last health sample" },
  { key: "sm_activity", title: "SM activity", unit: "%", from: "mean sm_activity of each GPU's last health sample" },
  { key: "online_latency", title: "Online latency (predicted)", unit: "% slower",
    from: "mean predicted online slowdown of the offline placements now (the matcher's prediction; measured latency is not in the read models)" },
  { key: "oversold", title: "Oversold GPUs", unit: "GPUs", from: "GPUs serving online and running an offline job" },
  { key: "queue", title: "Queue length", unit: "jobs", from: "jobs queued in the VCs this token sees" },
];

export class Sampler {
  constructor() {
    try {
      this.points = JSON.parse(sessionStorage.getItem(KEY) || "[]");
    } catch {
      this.points = [];
    }
  }

  clear() { // on logout: the next token's series starts empty
    this.points = [];
    sessionStorage.removeItem(KEY);
  }

  sample(state, now = Date.now()) {
    const gpus = [...state.gpus.values()];
    const metric = (name) => {
      const values = gpus.map((g) => (g.last_sample ? g.last_sample.metrics || {} : g.sample_metrics || {})[name]).filter((v) => typeof v === "number");
      return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
    };
    const slowdowns = state.placements.map((p) => p.placement && p.placement.predicted_online_slowdown).filter((v) => typeof v === "number");
    const point = {
      t: now, gpu_util: metric("gpu_util"), sm_activity: metric("sm_activity"),
      online_latency: slowdowns.length ? (100 * slowdowns.reduce((a, b) => a + b, 0)) / slowdowns.length : null,
      oversold: gpus.filter((g) => g.online_workload && g.offline_job).length,
      queue: state.vcs.reduce((n, vc) => n + (vc.queue || 0), 0),
    };
    this.points.push(point);
    if (this.points.length > KEEP) this.points.splice(0, this.points.length - KEEP);
    try {
      sessionStorage.setItem(KEY, JSON.stringify(this.points));
    } catch {
      /* storage full: the series stays in memory */
    }
    return point;
  }
}

export const SAMPLE_INTERVAL_MS = SAMPLE_MS;

export function renderCharts(root, points) {
  replace(root, SERIES.map((s) => chart(s, points)));
}

function chart(series, points) {
  const values = points.map((p) => [p.t, p[series.key]]).filter(([, v]) => v !== null && v !== undefined);
  const last = values.length ? values[values.length - 1][1] : null;
  const W = 300, H = 80, P = 2;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("class", "spark");
  if (values.length) {
    const t0 = values[0][0], t1 = Math.max(values[values.length - 1][0], t0 + 1);
    const max = Math.max(series.unit === "%" ? 100 : 1, ...values.map(([, v]) => v));
    const xy = values.map(([t, v]) => [P + ((W - 2 * P) * (t - t0)) / (t1 - t0), H - P - ((H - 2 * P) * v) / max]);
    const line = document.createElementNS(svg.namespaceURI, "polyline");
    line.setAttribute("points", xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" "));
    line.setAttribute("class", "line");
    const area = document.createElementNS(svg.namespaceURI, "polygon");
    area.setAttribute("points", `${xy[0][0]},${H - P} ` + xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ") + ` ${xy[xy.length - 1][0]},${H - P}`);
    area.setAttribute("class", "area");
    const top = document.createElementNS(svg.namespaceURI, "text");
    top.setAttribute("x", W - 4); top.setAttribute("y", 10); top.setAttribute("class", "axis"); top.setAttribute("text-anchor", "end");
    top.textContent = fmtNum(max, 0);
    svg.append(area, line, top);
  }
  const span = values.length > 1 ? Math.round((values[values.length - 1][0] - values[0][0]) / 60000) : 0;
  return h("figure", { class: "chart", dataset: { series: series.key }, title: series.from },
    h("figcaption", {}, h("span", {}, series.title), h("b", { dataset: { value: last ?? "" } }, last === null ? "no data" : `${fmtNum(last, 1)} ${series.unit}`)),
    svg, h("div", { class: "dim small" }, values.length ? `last ${span} min, ${values.length} samples; ${series.from}` : series.from));
}
