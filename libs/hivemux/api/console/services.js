// Online services (GET /api/v1/services): each service's worst replica p99 against its SLO as a
// bar (the SLO at 100 %, the 90 % mark where SLO-driven protection starts acting), its state
// (within, approaching, over), and per replica its GPU, latest p99, offline neighbour and
// launch target; the last protection step taken for it and how many of each.

import { fmtAgo, fmtNum, h, replace } from "./dom.js";

export function renderServices(root, services, { onJob }) {
  if (!services.length) {
    replace(root, h("p", { class: "empty" }, "No online service visible to this token yet."));
    return;
  }
  replace(root, h("table", { class: "services" },
    h("thead", {}, h("tr", {}, ["service", "VC", "replicas", "p99 / SLO", "", "per replica: GPU p99 (neighbour, launch target)", "last protection step"]
      .map((c) => h("th", {}, c)))),
    h("tbody", {}, services.map((s) => row(s, onJob)))));
}

function row(s, onJob) {
  const ratio = s.worst_p99_ms && s.slo_p99_ms ? s.worst_p99_ms / s.slo_p99_ms : 0;
  const bar = h("div", { class: "slobar", title: "worst replica's p99 against the SLO (tick: 90 %, where protection starts)" },
    h("span", { class: `slofill slo-${s.slo_state}`, style: `width:${Math.min(100, 100 * ratio)}%` }), h("span", { class: "slotick" }));
  const last = s.last_protection;
  const counts = Object.entries(s.protection_steps || {}).map(([k, n]) => `${k} ${n}`).join(", ");
  return h("tr", { dataset: { service: s.job_id, sloState: s.slo_state }, onclick: () => onJob(s.job_id) },
    h("td", {}, h("b", {}, s.job_id), h("div", { class: "dim small" }, `${s.model || ""} ${s.state}`)),
    h("td", {}, s.vc || "-"),
    h("td", {}, `${s.replicas_bound}/${s.replicas ?? "-"}`),
    h("td", { class: "nowrap", dataset: { p99: s.worst_p99_ms ?? "" } },
      `${fmtNum(s.worst_p99_ms)} / ${fmtNum(s.slo_p99_ms)} ms`, " ", h("span", { class: `chip slo-${s.slo_state}` }, s.slo_state)),
    h("td", { class: "slocell" }, bar),
    h("td", {}, (s.replica_latency || []).map((r) => h("div", { class: "replica", dataset: { gpu: r.gpu_id, sloState: r.slo_state } },
      h("span", { class: "mono" }, r.gpu_id), ` ${fmtNum(r.p99_ms)} ms`,
      h("span", { class: "dim" }, r.offline_job_id ? ` (${r.offline_job_id}${r.launch_target != null ? `, target ${fmtNum(r.launch_target, 2)}` : ""})` : ""),
      r.window_end ? h("span", { class: "dim small" }, ` ${fmtAgo(r.window_end)}`) : h("span", { class: "dim small" }, " no report yet")))),
    h("td", { dataset: { lastStep: last ? last.step : "" } }, last
      ? [h("span", {}, `${last.step} (level ${last.level}) on ${last.gpu_id}`), h("div", { class: "dim small", title: last.reason }, `${fmtAgo(last.occurred_at)}; ${counts}`)]
      : h("span", { class: "dim" }, "none")));
}
