// The console: log in with a token, load the snapshot from the REST endpoints, then keep it
// current from the change stream (upserts of jobs and GPUs; VC queues reloaded when jobs or the
// VC summary change; a full reload on resync or reconnect). Nothing here decides what a token
// may see: the API answers a tenant with its VCs' jobs only, and this page shows what it answers.

import { api, ApiError, forgetToken, setToken, subscribe, takeTokenFromUrl, token } from "./api.js";
import { renderCharts, Sampler } from "./charts.js";
import { $, h, replace } from "./dom.js";
import { renderGpuPanel, renderGpus } from "./gpus.js";
import { matches, renderFilters, renderJobPanel, renderJobs } from "./jobs.js";
import { renderLanes } from "./lanes.js";
import { renderServices } from "./services.js";
import { renderVcs } from "./vcs.js";

const JOB_LIMIT = 500;
const LOG_LINES = 200; // the job panel shows the last lines of its output
const state = {
  me: null, gpus: new Map(), vcs: [], services: [], lanes: { lane_gpus: [], lane_jobs: [] }, jobs: new Map(), filters: { state: "", vc: "", kind: "", text: "" },
  panel: null, // {type: "gpu" | "job", id}
  status: "connecting", cursor: 0, lastChange: null, source: null, vcNamesShown: null,
  archive: null, // hivemux up's broker archive, from /healthz (null: none here)
};
const sampler = new Sampler();
let dirty = new Set();
let vcsTimer = null;
let ticking = null;

function mark(...parts) {
  for (const p of parts) dirty.add(p);
  requestAnimationFrame(render);
}

function render() {
  if (!dirty.size || !state.me) return;
  const parts = dirty;
  dirty = new Set();
  if (parts.has("gpus")) renderGpus($("#gpus"), state.gpus, { selected: state.panel?.type === "gpu" ? state.panel.id : null, onSelect: openGpu });
  if (parts.has("vcs")) renderVcs($("#vcs"), state.vcs, { onJob: openJob });
  if (parts.has("services")) renderServices($("#services"), state.services, { onJob: openJob });
  if (parts.has("lanes")) renderLanes($("#lanes"), state.lanes, { onJob: openJob });
  if (parts.has("filters")) renderFilters($("#job-filters"), { filters: state.filters, vcs: vcNames(), onChange: setFilters });
  if (parts.has("vc-names")) { // the VC filter's options, when the VCs themselves changed (not on every queue reload: typing goes on)
    const names = vcNames().join(",");
    if (names !== state.vcNamesShown) {
      state.vcNamesShown = names;
      if (!parts.has("filters")) renderFilters($("#job-filters"), { filters: state.filters, vcs: vcNames(), onChange: setFilters });
    }
  }
  if (parts.has("jobs")) renderJobs($("#jobs"), state.jobs, { filters: state.filters, selected: state.panel?.type === "job" ? state.panel.id : null, onSelect: openJob, limit: JOB_LIMIT });
  if (parts.has("charts")) renderCharts($("#charts"), sampler.points);
  if (parts.has("status")) renderStatus();
}

function vcNames() {
  const names = new Set(state.vcs.map((v) => v.vc));
  for (const vc of state.me.vcs) names.add(vc);
  return [...names].sort();
}

function renderStatus() {
  const me = state.me;
  replace($("#who"), h("b", { dataset: { principal: me.principal } }, me.principal), me.admin ? " (admin: every VC)" : ` (tenant: ${me.vcs.join(", ") || "no VC"})`);
  replace($("#live"), h("span", { class: `dot ${state.status}`, dataset: { status: state.status } }), ` ${state.status}`,
    state.lastChange ? h("span", { class: "dim" }, ` - last change ${new Date(state.lastChange).toLocaleTimeString()} (cursor ${state.cursor})`) : "");
  replace($("#archive"), ...archiveLine(state.archive));
}

// The archiver's state and lag: how much a broker restart would lose now.
function archiveLine(a) {
  if (!a) return [];
  const ok = a.state === "archiving" && !a.lag_records;
  const lag = a.lag_records ? `${a.lag_records} records (${Math.round(a.lag_s)} s) behind the broker` : "up to date";
  const how = a.state === "archiving" ? "" : ` (archiver ${a.state}${a.restarts ? `, ${a.restarts} restarts` : ""})`;
  return [h("span", { class: `dot ${ok ? "live" : "closed"}`, dataset: { archive: a.state, lag: String(a.lag_records) }, title: a.last_error || "" }),
    ` history ${lag}${how}`];
}

async function loadArchive() {
  try {
    state.archive = (await api("/healthz")).archive ?? null;
  } catch { // the API's database away: /healthz answers 503; the archiver cannot report either
    state.archive = state.archive && { ...state.archive, state: "not reporting" };
  }
  mark("status");
}

// --- loading -------------------------------------------------------------------------------

async function loadAll() {
  const gpus = async () => {
    state.gpus = new Map((await api("/api/v1/cluster/gpus")).gpus.map((g) => [g.gpu_id, g]));
    mark("gpus");
  };
  const metrics = async () => addMetrics(await api("/api/v1/cluster/metrics"));
  await Promise.all([gpus(), metrics(), loadVcs(), loadServices(), loadLanes(), loadJobs(), loadArchive()]); // each drawn as it arrives
  mark("status");
  if (state.panel) refreshPanel();
}

async function loadVcs() {
  state.vcs = (await api("/api/v1/cluster/vcs")).vcs;
  mark("vcs", "vc-names");
}

// Latency is not on the change stream: the services are reloaded with each metrics event (every 5 s).
async function loadServices() {
  state.services = (await api("/api/v1/services")).services;
  mark("services");
}

// Lanes' iterations are not on the change stream either: reloaded with the services.
async function loadLanes() {
  state.lanes = await api("/api/v1/cluster/lanes");
  mark("lanes");
}

let jobsAsked = 0;

async function loadJobs() {
  const q = new URLSearchParams({ limit: String(JOB_LIMIT) });
  for (const k of ["state", "vc", "kind"]) if (state.filters[k]) q.set(k, state.filters[k]);
  const asked = ++jobsAsked;
  const { jobs } = await api(`/api/v1/jobs?${q}`);
  if (asked !== jobsAsked) return; // the filters changed meanwhile: a later answer is coming
  state.jobs = new Map(jobs.map((j) => [j.job_id, j]));
  mark("jobs");
}

// Queues with positions come from the REST endpoint (it ranks every queued job): reloaded at most
// every second, or every 5 times as long as the last load took (a long queue costs the server).
let vcsLoadMs = 0;

function reloadVcsSoon() {
  if (vcsTimer) return;
  vcsTimer = setTimeout(async () => {
    const started = performance.now();
    try {
      await loadVcs();
    } catch (error) {
      showError(error);
    } finally {
      vcsLoadMs = performance.now() - started;
      vcsTimer = null;
    }
  }, Math.max(1000, 5 * vcsLoadMs));
}

function applyChange(batch) {
  state.cursor = batch.cursor;
  state.lastChange = Date.now();
  if (batch.resync) {
    loadAll().catch(showError);
    return;
  }
  for (const gpu of batch.gpus || []) state.gpus.set(gpu.gpu_id, { ...state.gpus.get(gpu.gpu_id), ...gpu, last_sample: sampleOf(gpu) });
  for (const job of batch.jobs || []) {
    if (matches(job, { ...state.filters, text: "" })) state.jobs.set(job.job_id, job);
    else state.jobs.delete(job.job_id);
  }
  if ((batch.jobs || []).length || batch.vcs) reloadVcsSoon();
  mark("status", batch.gpus?.length ? "gpus" : null, batch.jobs?.length ? "jobs" : null);
  if (state.panel && ((state.panel.type === "job" && (batch.jobs || []).some((j) => j.job_id === state.panel.id)) ||
      (state.panel.type === "gpu" && (batch.gpus || []).some((g) => g.gpu_id === state.panel.id)))) refreshPanel();
}

function addMetrics(metrics) {
  if (sampler.add(metrics)) mark("charts");
  if (state.me) loadServices().catch(showError);
  if (state.me) loadLanes().catch(showError);
  if (state.me) loadArchive();
}

function sampleOf(gpu) { // the stream sends the GPU row; the REST list adds last_sample from the same columns
  return gpu.sample_at ? { at: gpu.sample_at, metrics: gpu.sample_metrics || {} } : null;
}

function setFilters(filters, { local } = {}) {
  const serverSide = ["state", "vc", "kind"].some((k) => filters[k] !== state.filters[k]);
  state.filters = filters;
  if (serverSide) loadJobs().catch(showError);
  mark("jobs", local ? null : "filters");
}

// --- panels --------------------------------------------------------------------------------

function openGpu(id) {
  state.panel = { type: "gpu", id };
  mark("gpus", "jobs");
  refreshPanel();
}

function openJob(id) {
  state.panel = { type: "job", id };
  mark("gpus", "jobs");
  refreshPanel();
}

// A live update re-renders the panel: what the operator was typing as a reason is kept.
function keepDraft(root, panel, render) {
  const input = root.querySelector("input.reason");
  const draft = input && root.dataset.panel === `${panel.type}:${panel.id}` ? { value: input.value, focused: document.activeElement === input } : null;
  render();
  root.dataset.panel = `${panel.type}:${panel.id}`;
  const fresh = root.querySelector("input.reason");
  if (draft && fresh) {
    fresh.value = draft.value;
    if (draft.focused) fresh.focus();
  }
}

async function refreshPanel(error) {
  const panel = state.panel;
  const root = $("#panel-body");
  $("#panel").hidden = false;
  try {
    if (panel.type === "gpu") {
      const x = await api(`/api/v1/cluster/gpus/${panel.id.split("/").map(encodeURIComponent).join("/")}`);
      if (state.panel !== panel) return;
      keepDraft(root, panel, () => renderGpuPanel(root, x, { admin: state.me.admin, onDrain: drain }));
    } else {
      const id = encodeURIComponent(panel.id);
      const [job, explain, history, log] = await Promise.all([api(`/api/v1/jobs/${id}`), api(`/api/v1/jobs/${id}/explain`),
        api(`/api/v1/jobs/${id}/history`), api(`/api/v1/jobs/${id}/logs?tail=${LOG_LINES}`)]);
      if (state.panel !== panel) return;
      state.jobs.set(job.job_id, job);
      keepDraft(root, panel, () => renderJobPanel(root, { job, explain, history, log, mayAct: state.me.admin || state.me.vcs.includes(job.vc), onCommand: command, error }));
    }
  } catch (err) {
    if (state.panel === panel) replace(root, h("p", { class: "error", dataset: { status: err.status || "" } }, describe(err)));
  }
}

function clearDraft() { // a reason goes with one command
  const input = $("#panel-body input.reason");
  if (input) input.value = "";
}

async function command(jobId, action, reason) {
  clearDraft();
  let note;
  try {
    const answer = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}/${action}`, { method: "POST", body: { reason, wait_s: 5 } });
    const outcome = answer.outcome;
    note = outcome ? (outcome.refused ? `${action} refused: ${outcome.reason}` : null) : `${action} sent; the job controller has not answered yet`;
  } catch (err) {
    note = describe(err);
  }
  await refreshPanel(note);
}

async function drain(gpuId, undo, reason) {
  clearDraft();
  try {
    await api(`/api/v1/admin/gpus/${undo ? "undrain" : "drain"}`, { method: "POST", body: { gpu_id: gpuId, reason } });
    toast(`${undo ? "undrain" : "drain"} of ${gpuId} sent`);
  } catch (err) {
    showError(err);
  }
}

// --- errors, login -------------------------------------------------------------------------

function describe(err) {
  if (err instanceof ApiError) {
    const detail = Array.isArray(err.detail) ? err.detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ") : err.message;
    return `${err.status}: ${detail}`;
  }
  return String(err && err.message ? err.message : err);
}

function showError(err) {
  if (err instanceof ApiError && err.status === 401) {
    logout(describe(err));
    return;
  }
  toast(describe(err), true);
}

function toast(text, bad = false) {
  const el = h("div", { class: `toast${bad ? " bad" : ""}` }, text);
  $("#toasts").append(el);
  setTimeout(() => el.remove(), 6000);
}

function logout(message) {
  forgetToken();
  sampler.clear();
  if (state.source) state.source.close();
  state.me = null;
  $("#app").hidden = true;
  $("#login").hidden = false;
  replace($("#login-error"), message || "");
}

// EventSource reconnects by itself after a network error, not after an HTTP error (a revoked
// token's 401, a 503): then the token is checked (401: back to the login) and the stream reopened.
function connect() {
  state.source = subscribe({
    onHello: () => loadAll().catch(showError),
    onChange: applyChange,
    onMetrics: addMetrics,
    onRevoked: (reason) => logout(`401: ${reason}`),
    onStatus: (s) => {
      state.status = s;
      mark("status");
      if (s === "closed") setTimeout(reconnect, 3000);
    },
  });
}

async function reconnect() {
  if (!state.me) return;
  try {
    await api("/api/v1/whoami");
  } catch (err) {
    showError(err);
    if (!state.me) return;
  }
  connect();
}

async function start() {
  $("#login").hidden = true;
  try {
    state.me = await api("/api/v1/whoami");
  } catch (err) {
    logout(describe(err));
    return;
  }
  $("#app").hidden = false;
  mark("status", "filters");
  connect();
  if (!ticking) ticking = setInterval(() => state.me && mark("gpus"), 5000); // the tiles' "changed ... ago"
  mark("charts");
}

$("#login-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setToken($("#token").value);
  $("#token").value = "";
  start();
});
$("#logout").addEventListener("click", () => logout("Logged out."));
$("#panel-close").addEventListener("click", () => {
  state.panel = null;
  $("#panel").hidden = true;
  mark("gpus", "jobs");
});

takeTokenFromUrl();
if (token()) start();
else $("#login").hidden = false;
