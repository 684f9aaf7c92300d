// Every GPU as a tile, grouped by node, coloured by its SysMonitor health state
// (Init, Healthy, Unhealthy, Overlimit, Disabled), with its online service, its offline job and
// that job's SM share. Clicking a tile opens the GPU's state history with causes (gpu panel).

import { fmtAgo, fmtNum, fmtTime, h, replace } from "./dom.js";

export const HEALTH = ["Init", "Healthy", "Unhealthy", "Overlimit", "Disabled"];

// A CPU device (`hivemux up --executor process` without GPUs) has the type "<type>-cpu"
// (hivemux.telemetry.readings.cpu_device_type): say what it is wherever a type shows.
export const isCpuDevice = (type) => typeof type === "string" && type.endsWith("-cpu");
export function deviceLabel(type) {
  if (!type) return "-";
  return isCpuDevice(type) ? `${type} (CPU device: a CPU-backed stand-in for a ${type.slice(0, -4)}, not a GPU)` : type;
}

export function renderGpus(root, gpus, { selected, onSelect }) {
  const byNode = new Map();
  for (const gpu of [...gpus.values()].sort((a, b) => a.gpu_id.localeCompare(b.gpu_id, undefined, { numeric: true }))) {
    const node = gpu.node_id || gpu.gpu_id.split("/")[0];
    if (!byNode.has(node)) byNode.set(node, []);
    byNode.get(node).push(gpu);
  }
  const counts = Object.fromEntries(HEALTH.map((s) => [s, 0]));
  for (const gpu of gpus.values()) counts[gpu.health || "Init"] = (counts[gpu.health || "Init"] || 0) + 1;
  const legend = h("div", { class: "legend" },
    HEALTH.map((s) => h("span", { class: `chip health-${s}`, dataset: { legend: s } }, `${s} ${counts[s] || 0}`)));
  const nodes = [...byNode.entries()].map(([node, list]) =>
    h("div", { class: "node" }, h("div", { class: "node-name" }, node), h("div", { class: "tiles" }, list.map((g) => tile(g, selected, onSelect)))));
  replace(root, legend, gpus.size ? nodes : h("p", { class: "empty" }, "No GPU in the read model yet (the projector folds gpu.health)."));
}

function tile(gpu, selected, onSelect) {
  const health = gpu.health || "Init";
  const short = gpu.gpu_id.includes("/") ? gpu.gpu_id.slice(gpu.gpu_id.indexOf("/") + 1) : gpu.gpu_id;
  const sample = gpu.last_sample ? gpu.last_sample.metrics || {} : gpu.sample_metrics || {};
  const title = `${gpu.gpu_id} (${deviceLabel(gpu.gpu_type)}): ${health}` + (gpu.health_reason ? ` - ${gpu.health_cause || ""}: ${gpu.health_reason}` : "");
  return h("button", {
      class: `tile health-${health}${selected === gpu.gpu_id ? " selected" : ""}`, title, type: "button",
      dataset: { gpuId: gpu.gpu_id, health }, onclick: () => onSelect(gpu.gpu_id),
    },
    h("div", { class: "tile-head" }, h("b", {}, short), isCpuDevice(gpu.gpu_type) ? h("span", { class: "tile-cpu", dataset: { cpuDevice: "1" } }, " CPU device") : null,
      h("span", { class: "tile-state" }, health)),
    h("div", { class: "tile-line", title: "online service" }, "on: ", gpu.online_workload || "-"),
    h("div", { class: "tile-line", title: "offline job and its SM share" }, "off: ", gpu.offline_job || "-",
      gpu.offline_job && gpu.sm_share !== null && gpu.sm_share !== undefined ? ` (${fmtNum(gpu.sm_share, 0)}% SM)` : ""),
    h("div", { class: "tile-line dim" }, sample.gpu_util !== undefined ? `util ${fmtNum(sample.gpu_util, 0)}%` : "",
      sample.sm_activity !== undefined && sample.sm_activity !== null ? ` sm ${fmtNum(sample.sm_activity, 0)}%` : "",
      gpu.changed_at ? `  ${fmtAgo(gpu.changed_at)}` : ""));
}

// The GPU panel: now, and every state change with its cause, metrics and offending thresholds.
export function renderGpuPanel(root, x, { admin, onDrain }) {
  const reason = h("input", { type: "text", placeholder: "reason (optional)", class: "reason", maxlength: 500 });
  const actions = admin
    ? h("div", { class: "actions" }, reason,
        h("button", { type: "button", class: "danger", dataset: { action: "drain" }, onclick: () => onDrain(x.gpu_id, false, reason.value) }, "Drain"),
        h("button", { type: "button", dataset: { action: "undrain" }, onclick: () => onDrain(x.gpu_id, true, reason.value) }, "Undrain"))
    : null;
  const transitions = (x.transitions || []).slice().reverse();
  replace(root,
    h("h2", {}, `GPU ${x.gpu_id}`, " ", h("span", { class: `chip health-${x.health || "Init"}`, dataset: { panelHealth: x.health || "" } }, x.health || "unknown")),
    h("dl", { class: "facts" },
      fact("node / type", `${x.node_id || "-"} / ${deviceLabel(x.gpu_type)}`),
      fact("cause", x.cause ? `${x.cause}: ${x.reason || ""}` : "-"),
      fact("online service", x.online_workload || "-"),
      fact("offline job", x.offline_job ? `${x.offline_job} (${fmtNum(x.sm_share, 0)}% SM since ${x.offline_since || "?"})` : "-"),
      fact("last sample", x.last_sample ? `${fmtTime(x.last_sample.at)}  ${metricText(x.last_sample.metrics)}` : "-"),
      fact("sharing", x.sharing ? x.sharing.text : "MPS (space-shared)"),
      fact("entries by state", Object.entries(x.entries_by_state || {}).map(([s, n]) => `${s} ${n}`).join(", ") || "-")),
    actions,
    h("h3", {}, `State history (${transitions.length}, newest first)`),
    transitions.length
      ? h("table", { class: "history" },
          h("thead", {}, h("tr", {}, ["time", "from", "to", "cause", "reason", "metrics / offending"].map((c) => h("th", {}, c)))),
          h("tbody", {}, transitions.map((t) => h("tr", { dataset: { to: t.to } },
            h("td", { class: "nowrap" }, fmtTime(t.at)), h("td", {}, t.from || "?"), h("td", {}, h("span", { class: `chip health-${t.to}` }, t.to)),
            h("td", {}, t.cause || "-"), h("td", {}, t.reason || "", (t.evicted || []).length ? ` (evicted ${t.evicted.join(", ")})` : ""),
            h("td", { class: "mono metrics", title: (t.offending || []).map(offending).join("\n") },
              Object.entries(t.metrics || {}).map(([k, v]) => h("span", { class: "metric" }, `${k}=${typeof v === "number" ? fmtNum(v, 1) : v}`)))))))
      : h("p", { class: "empty" }, "No state change recorded."),
    h("h3", {}, `Offline placements (${(x.placements || []).length})`),
    h("ul", { class: "plain" }, (x.placements || []).slice(-20).reverse().map((p) =>
      h("li", {}, `${fmtTime(p.at)}  ${p.action} ${p.job_id || ""} sm ${fmtNum(p.sm_share, 0)}% (predicted online slowdown ${fmtNum(100 * (p.predicted_online_slowdown ?? NaN), 1)}%) ${p.reason || ""}`))),
    h("h3", {}, `Faults (${(x.faults || []).length})`),
    h("ul", { class: "plain" }, (x.faults || []).slice(-20).reverse().map((f) => h("li", {}, `${fmtTime(f.at)}  ${f.kind}: ${f.detail}`))));
}

function fact(name, value) {
  return [h("dt", {}, name), h("dd", {}, value)];
}

function metricText(metrics) {
  return Object.entries(metrics || {}).map(([k, v]) => `${k}=${typeof v === "number" ? fmtNum(v, 1) : v}`).join("  ");
}

function offending(o) {
  return Object.entries(o).map(([k, v]) => `${k}=${typeof v === "number" ? fmtNum(v, 2) : v}`).join(" ");
}
