// Salus lanes (GET /api/v1/cluster/lanes): each lane GPU (a VC's 1-GPU cell the cell allocator
// packs with small training jobs; guaranteed or opportunistic, its capacity C and iteration
// policy) and the lane jobs on it: lane, state and iterations as the executors reported them.
// Lane jobs are grouped by the lane GPU of their latest lane (a given-back one says so).

import { fmtNum, h, replace } from "./dom.js";

export function renderLanes(root, { lane_gpus: gpus, lane_jobs: jobs }, { onJob }) {
  if (!gpus.length && !jobs.length) {
    replace(root, h("p", { class: "empty" }, "No lane GPU or lane job visible to this token yet."));
    return;
  }
  const byGpu = new Map(gpus.map((g) => [g.job_id, { gpu: g, jobs: [] }]));
  for (const j of jobs) {
    if (!byGpu.has(j.lane_gpu)) byGpu.set(j.lane_gpu, { gpu: { job_id: j.lane_gpu, vc: j.vc, gpu_ids: [], state: "-" }, jobs: [] });
    byGpu.get(j.lane_gpu).jobs.push(j);
  }
  replace(root, h("table", { class: "services lanes" },
    h("thead", {}, h("tr", {}, ["lane GPU", "VC", "GPU", "C / policy", "lane jobs: lane, state, iterations"].map((c) => h("th", {}, c)))),
    h("tbody", {}, [...byGpu.values()].map(({ gpu, jobs: on }) => h("tr", { dataset: { laneGpu: gpu.job_id, state: gpu.state } },
      h("td", {}, h("b", { class: "mono" }, gpu.job_id), h("div", { class: "dim small" }, `${gpu.priority || ""} ${gpu.state}`)),
      h("td", {}, gpu.vc || "-"),
      h("td", { class: "mono" }, (gpu.gpu_ids || []).join(", ") || h("span", { class: "dim" }, "given back")),
      h("td", { class: "nowrap" }, `${gpu.capacity_mib != null ? `${fmtNum(gpu.capacity_mib, 0)} MiB` : "-"} / ${String(gpu.policy || "-").toUpperCase()}`),
      h("td", {}, on.length ? on.map((j) => h("div", { class: "replica", dataset: { jobId: j.job_id, state: j.state || "" }, onclick: () => onJob(j.job_id) },
        h("span", { class: "mono" }, j.job_id), ` lane ${j.lane_id} ${String(j.policy || "").toUpperCase()} `, h("span", { class: `state state-${j.state}` }, j.state || "-"),
        ` ${j.iterations_done ?? "-"}/${j.iterations_total ?? "-"} it`, iterBar(j))) : h("span", { class: "dim" }, "no lane job")))))));
}

function iterBar(j) {
  const ratio = j.iterations_total ? j.iterations_done / j.iterations_total : 0;
  return h("span", { class: "slobar", title: "iterations done of the total" },
    h("span", { class: "slofill slo-within", style: `width:${Math.min(100, 100 * ratio)}%` }));
}
