// Charts over time, drawn as plain SVG, of the API's cluster gauges (`GET /api/v1/cluster/metrics`
// once at load, then the change stream's ``metrics`` event every 5 s), kept by this page in the
// tab's sessionStorage for an hour (a reload keeps them, a new tab starts with one point). The
// read models hold each GPU's current state and its last metric-driven health sample, not a
// telemetry time series (the projector does not fold the 1 Hz telemetry), and no measured online
// latency: each chart says what it is computed from.

import { fmtNum, h, replace } from "./dom.js";

const KEY = "hivemux.series";
const KEEP = 720; // one hour at 5 s

export const SERIES = [
  { key: "gpu_util", title: "GPU utilization", unit: "%", from: "mean gpu_util of each GPU's last health sample (moves when health does)" },
  { key: "sm_activity", title: "SM activity", unit: "%", from: "mean sm_activity of each GPU's last health sample (moves when health does)" },
  { key: "online_latency", title: "Online latency (predicted)", unit: "% slower",
    from: "mean predicted online slowdown of the offline jobs sharing GPUs now (the matcher's prediction; each service's measured p99 is in the Online services table)" },
  { key: "oversold", title: "Oversold GPUs", unit: "GPUs", from: "online GPUs lent to an offline job (MuxFlow sharing)" },
  { key: "queue", title: "Queue length", unit: "jobs", from: "jobs queued in the VCs this token sees" },
  { key: "not_healthy", title: "GPUs not Healthy", unit: "GPUs", from: "GPUs Unhealthy, Overlimit or Disabled" },
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

  // One gauge reading (`api.metrics`: the REST answer or a stream event) as a point.
  add(m) {
    const byHealth = m.gpus_by_health || {};
    const point = {
      t: Date.parse(m.at) || Date.now(), gpu_util: m.gpu_util_mean ?? null, sm_activity: m.sm_activity_mean ?? null,
      online_latency: typeof m.online_slowdown_mean === "number" ? 100 * m.online_slowdown_mean : null,
      oversold: m.oversold_gpus ?? null, queue: Object.values(m.queue_length || {}).reduce((a, b) => a + b, 0),
      not_healthy: (byHealth.Unhealthy || 0) + (byHealth.Overlimit || 0) + (byHealth.Disabled || 0),
    };
    if (this.points.length && this.points[this.points.length - 1].t >= point.t) return null; // a repeat (reconnect)
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
    const [lx, ly] = xy[xy.length - 1];
    const dot = document.createElementNS(svg.namespaceURI, "circle"); // the latest reading (and the only one, at first)
    dot.setAttribute("cx", lx.toFixed(1)); dot.setAttribute("cy", ly.toFixed(1)); dot.setAttribute("r", "2.5"); dot.setAttribute("class", "dot");
    svg.append(area, line, top, dot);
  }
  const span = values.length > 1 ? Math.round((values[values.length - 1][0] - values[0][0]) / 60000) : 0;
  return h("figure", { class: "chart", dataset: { series: series.key }, title: series.from },
    h("figcaption", {}, h("span", {}, series.title), h("b", { dataset: { value: last ?? "" } }, last === null ? "no data" : `${fmtNum(last, 1)} ${series.unit}`)),
    svg, h("div", { class: "dim small" }, values.length ? `last ${span} min, ${values.length} reading${values.length === 1 ? "" : "s"}; ${series.from}` : series.from));
}
