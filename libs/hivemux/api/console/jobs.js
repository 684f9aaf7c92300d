// The jobs table (filtered by state, VC, kind on the server and by id/reason text here) and a
// job's panel: what it is, its verdict and queue position, the explain chain (every decision in
// order, repeats collapsed) and its full timeline; its output (the last lines its executors
// shipped, each line a text node: a workload's output is never HTML); cancel/suspend/resume for
// whoever may act on it.

import { fmtAgo, fmtNum, fmtTime, h, kv, replace } from "./dom.js";
import { deviceLabel } from "./gpus.js";

export const STATES = ["submitted", "profiled", "waiting", "placed", "bound", "running", "suspended", "resumed",
  "preempted", "evicted", "stopped", "completed", "failed", "rejected", "cancelled"];

export function matches(job, filters) {
  if (job.kind === "lane-gpu" && filters.kind !== "lane-gpu") return false; // the allocator's lane GPUs: not a user's job
  if (filters.state && job.state !== filters.state) return false;
  if (filters.vc && job.vc !== filters.vc) return false;
  if (filters.kind && job.kind !== filters.kind) return false;
  if (filters.text) {
    const t = filters.text.toLowerCase();
    if (!job.job_id.toLowerCase().includes(t) && !(job.last_reason || "").toLowerCase().includes(t)) return false;
  }
  return true;
}

export function renderFilters(root, { filters, vcs, onChange }) {
  const select = (name, options) => h("select", { name, onchange: (e) => onChange({ ...filters, [name]: e.target.value }) },
    h("option", { value: "" }, `any ${name}`), options.map((o) => h("option", { value: o, selected: filters[name] === o }, o)));
  const text = h("input", { type: "search", name: "text", placeholder: "job id or reason", value: filters.text || "" });
  text.addEventListener("input", () => onChange({ ...filters, text: text.value }, { local: true }));
  replace(root, select("state", STATES), select("vc", vcs), select("kind", ["offline", "training", "online", "lane-gpu"]), text);
}

export function renderJobs(root, jobs, { filters, selected, onSelect, limit }) {
  const shown = [...jobs.values()].filter((j) => matches(j, filters))
    .sort((a, b) => (b.updated_at || "").localeCompare(a.updated_at || "") || a.job_id.localeCompare(b.job_id));
  const rows = shown.slice(0, limit).map((j) => h("tr", {
      dataset: { jobId: j.job_id, state: j.state }, class: selected === j.job_id ? "selected" : "", onclick: () => onSelect(j.job_id),
    },
    h("td", { class: "mono" }, j.job_id), h("td", {}, h("span", { class: `state state-${j.state}` }, j.state)), h("td", {}, j.vc || "-"),
    h("td", {}, j.kind || "-"), h("td", {}, `${j.priority || "-"}${j.priority_value !== null && j.priority_value !== undefined ? ` ${j.priority_value}` : ""}`),
    h("td", {}, where(j)), h("td", { class: "nowrap" }, fmtAgo(j.submitted_at)), h("td", { class: "nowrap" }, fmtAgo(j.updated_at)),
    h("td", { class: "reason-cell", title: j.last_reason || "" }, j.last_reason || "")));
  replace(root,
    h("table", { class: "jobs" },
      h("thead", {}, h("tr", {}, ["job", "state", "VC", "kind", "priority", "where", "submitted", "updated", "last reason"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows)),
    h("p", { class: "dim" }, `${Math.min(shown.length, limit)} of ${shown.length} shown` + (jobs.size >= limit ? ` (the first ${limit} by job id match the filters on load, and every job that changed since: narrow the filters)` : "")));
}

// Where a job runs; a finished job's last placement or binding is marked "was" (the read model keeps it).
const FINISHED = new Set(["completed", "failed", "rejected", "cancelled"]);
const ENDED = new Set(["completed", "failed", "rejected", "cancelled", "stopped", "suspended", "evicted", "preempted"]);

function where(job) {
  const was = ENDED.has(job.state) ? "was " : "";
  if (job.lane) return `${was}${job.lane.gpu_id} lane ${job.lane.lane_id}`;
  if (job.placement) return `${was}${job.placement.gpu_id} ${fmtNum(job.placement.sm_share, 0)}% SM`;
  const pods = Object.values(job.binding || {});
  if (pods.length) return was + [...new Set(pods.flatMap((p) => p.node_ids || []))].join(", ") + ` (${pods.length} pod${pods.length > 1 ? "s" : ""})`;
  return job.gpus ? `${job.pods || 1}x${job.gpus} GPU` : "-";
}

export function renderJobPanel(root, { job, explain, history, log, mayAct, onCommand, error }) {
  const reason = h("input", { type: "text", placeholder: "reason (optional)", class: "reason", maxlength: 500 });
  const over = FINISHED.has(job.state);
  const applies = { cancel: !over, suspend: !over && job.state !== "suspended", resume: job.state === "suspended" };
  const button = (action, label, cls) => h("button", { type: "button", class: cls || "", dataset: { action }, disabled: !applies[action],
    title: applies[action] ? "" : `not for a ${job.state} job`, onclick: () => onCommand(job.job_id, action, reason.value) }, label);
  const q = explain && explain.queue;
  replace(root,
    h("h2", {}, `Job ${job.job_id} `, h("span", { class: `state state-${job.state}`, dataset: { panelState: job.state } }, job.state)),
    explain ? h("p", { class: "verdict" }, explain.verdict) : null,
    error ? h("p", { class: "error" }, error) : null,
    h("dl", { class: "facts" },
      [["VC / kind", `${job.vc || "-"} / ${job.kind || "-"}`], ["priority", `${job.priority || "-"} ${job.priority_value ?? ""}`],
       ["size", `${job.pods || 1} pod(s) x ${job.gpus || 1} GPU`], ["where", where(job)], ["submitted", fmtTime(job.submitted_at)],
       ["updated", fmtTime(job.updated_at)], ["last reason", job.last_reason || "-"],
       ["devices", Object.entries(job.devices || {}).map(([type, n]) => `${n} x ${deviceLabel(type)}`).join(", ") || "-"],
       ["queue", q ? `position ${q.position} of ${q.of} in ${q.vc}` + (q.ahead.length ? ` (behind ${q.ahead.slice(0, 5).join(", ")}${q.ahead.length > 5 ? ", ..." : ""})` : "") + (q.waiting_for ? `; waiting for: ${q.waiting_for}` : "") : "-"],
      ].map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    job.service ? serviceFacts(job.service) : null,
    job.lane ? laneFacts(job.lane) : null,
    job.lane_gpu ? laneGpuFacts(job.lane_gpu) : null,
    log ? logPanel(log) : null,
    mayAct ? h("div", { class: "actions" }, reason, button("cancel", "Cancel", "danger"), button("suspend", "Suspend"), button("resume", "Resume")) : null,
    explain ? [
      h("h3", {}, `Explain chain (${explain.chain.length} decisions)`),
      h("ol", { class: "chain" }, explain.chain.map((c) => h("li", { dataset: { kind: c.kind, what: c.what } },
        h("span", { class: "nowrap dim" }, fmtTime(c.at)), " ", h("b", {}, `${c.kind}: ${c.what}`), c.count > 1 ? ` x${c.count} (until ${fmtTime(c.last)})` : "",
        c.reason ? h("div", { class: "reason-line" }, c.reason) : null,
        Object.keys(c.inputs || {}).length ? h("div", { class: "mono dim" }, kv(c.inputs)) : null))),
      (explain.waiting || []).length ? [h("h3", {}, "Waiting reasons"), h("ul", { class: "plain" }, explain.waiting.map((w) =>
        h("li", {}, `${w.reason} (x${w.count}, ${fmtTime(w.first)} .. ${fmtTime(w.last)})`)))] : null,
    ] : null,
    history ? [
      h("h3", {}, `Timeline (${history.events.length} events)`),
      h("table", { class: "history" }, h("tbody", {}, history.events.map((e) => h("tr", {},
        h("td", { class: "nowrap" }, fmtTime(e.occurred_at)), h("td", {}, e.kind), h("td", {}, h("b", {}, e.what)),
        h("td", {}, e.reason, e.inputs && e.inputs.principal ? h("span", { class: "dim" }, ` (by ${e.inputs.principal})`) : ""),
        h("td", { class: "mono dim" }, `${e.topic}/${e.partition}@${e.offset}`)))))
    ] : null);
}

// The job's output (GET /api/v1/jobs/{id}/logs?tail=N): one text node per line, a span not kept said as such.
function logPanel(log) {
  const streams = new Set(log.lines.map((l) => `${l.pod} ${l.node_id}`));
  const text = log.lines.map((l) => (streams.size > 1 ? `[pod ${l.pod} ${l.node_id}] ` : "") +
    (l.dropped ? `[... ${l.dropped} bytes not kept ...]` : l.text)).join("\n");
  return h("div", { class: "job-log", dataset: { lines: log.lines.length } },
    h("h3", {}, `Output (last ${log.lines.length} lines)`, log.truncated ? " (older output left out)" : ""),
    log.lines.length ? h("pre", { class: "log" }, text) : h("p", { class: "dim" }, "no output shipped yet"));
}

// A lane job's lane (the describe's `lane`: `store.lanes.lane_detail`), e.g. "lane 1 on node-00/gpu-2 (PACK) of lane-gpu:vc-a:1, ...".
function laneFacts(lane) {
  return h("div", { class: "lane", dataset: { lane: lane.lane_id, gpu: lane.gpu_id, policy: lane.policy } },
    h("h3", {}, "Salus lane"), h("p", { class: "lane-line" }, lane.line),
    lane.throughput_it_s != null ? h("p", { class: "dim" }, `${fmtNum(lane.throughput_it_s)} it/s, last report ${fmtTime(lane.reported_at)}`) : null);
}

// A lane GPU (kind lane-gpu): its group and the lane jobs packed on it.
function laneGpuFacts(g) {
  return h("div", { class: "lane-gpu", dataset: { laneGpu: g.job_id } },
    h("h3", {}, `Lane GPU: ${g.priority || "-"} GPU of ${g.vc} on ${(g.gpu_ids || []).join(", ") || "- (given back)"}`,
      g.capacity_mib != null ? `, C ${fmtNum(g.capacity_mib, 0)} MiB` : "", `, ${String(g.policy || "-").toUpperCase()}`),
    h("ul", { class: "plain" }, (g.lane_jobs || []).map((j) => h("li", { dataset: { jobId: j.job_id } }, h("span", { class: "mono" }, j.job_id), ` ${j.state}: ${j.line}`))));
}

// An online service's measured latency (the describe's `service`, from GET /api/v1/services' rows).
function serviceFacts(s) {
  const last = s.last_protection;
  return h("div", { class: "service-latency", dataset: { sloState: s.slo_state } },
    h("h3", {}, `Latency: worst p99 ${fmtNum(s.worst_p99_ms)} / SLO ${fmtNum(s.slo_p99_ms)} ms `, h("span", { class: `chip slo-${s.slo_state}` }, s.slo_state)),
    h("ul", { class: "plain" }, (s.replica_latency || []).map((r) => h("li", { dataset: { gpu: r.gpu_id } },
      h("span", { class: "mono" }, r.gpu_id), r.endpoint ? h("span", { class: "mono endpoint" }, ` ${r.endpoint}`) : "",
      ` p99 ${fmtNum(r.p99_ms)} ms, p50 ${fmtNum(r.p50_ms)} ms, ${fmtNum(r.request_rate, 0)} req/s`,
      r.offline_job_id ? h("span", { class: "dim" }, ` beside ${r.offline_job_id}`) : "", ` (${r.slo_state})`))),
    last ? h("p", { class: "dim" }, `last protection step: ${last.step} (level ${last.level}) on ${last.gpu_id}, ${fmtTime(last.occurred_at)}: ${last.reason}`) : null);
}
