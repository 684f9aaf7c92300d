// Each VC's cells (guaranteed, used, opportunistic, free, bad GPUs) and its queues in order,
// one queue per job kind, each job with its position (the order HiveD / the matcher serve them).

import { fmtAgo, h, replace } from "./dom.js";

const SHOWN = 50; // per queue: the head of a long queue is what an operator reads

export function renderVcs(root, vcs, { onJob }) {
  if (!vcs.length) {
    replace(root, h("p", { class: "empty" }, "No VC visible to this token yet."));
    return;
  }
  replace(root, vcs.map((vc) => card(vc, onJob)));
}

function card(vc, onJob) {
  const total = Math.max(vc.guaranteed + vc.opportunistic, 1);
  const bar = h("div", { class: "cellbar", title: "used / free of the guaranteed GPUs, then opportunistic use" },
    seg("used", vc.used, total), seg("free", vc.free, total), seg("opportunistic", vc.opportunistic, total));
  const queues = Object.entries(vc.queues || {});
  return h("section", { class: "vc", dataset: { vc: vc.vc } },
    h("header", {}, h("h3", {}, vc.vc), h("span", { class: "dim", dataset: { queueLength: vc.queue } }, `${vc.queue} queued`)),
    h("div", { class: "cells" },
      num("guaranteed", vc.guaranteed), num("used", vc.used), num("opportunistic", vc.opportunistic), num("free", vc.free), num("bad", vc.bad)),
    bar,
    vc.lanes ? h("p", { class: "dim small", dataset: { laneGpus: vc.lanes } }, `${vc.lanes} of the used GPUs host Salus lanes`) : null,
    queues.length
      ? queues.map(([kind, jobs]) => h("div", { class: "queue", dataset: { kind } },
          h("div", { class: "queue-title" }, `${kind} queue (${jobs.length})`),
          h("ol", {}, jobs.slice(0, SHOWN).map((q, i) => h("li", { dataset: { jobId: q.job_id, position: i + 1 }, onclick: () => onJob(q.job_id), title: q.reason || "" },
            h("span", { class: "pos" }, `#${i + 1}`), " ", h("b", {}, q.job_id), " ", h("span", { class: `state state-${q.state}` }, q.state),
            " ", h("span", { class: "dim" }, `${q.priority || ""}${q.priority_value !== null && q.priority_value !== undefined ? ` ${q.priority_value}` : ""}, since ${fmtAgo(q.since)}`),
            q.reason ? h("div", { class: "reason-line" }, q.reason) : null))),
          jobs.length > SHOWN ? h("div", { class: "dim" }, `... and ${jobs.length - SHOWN} more (the jobs table, filtered by this VC, lists them)`) : null))
      : h("p", { class: "empty" }, "Queue empty."));
}

function num(name, value) {
  return h("div", { class: `cell cell-${name}`, dataset: { cell: name } }, h("b", {}, String(value ?? 0)), h("span", {}, name));
}

function seg(name, value, total) {
  return h("span", { class: `seg seg-${name}`, style: `width:${(100 * (value || 0)) / total}%` });
}
