// Small DOM helpers. Every text from the API (job ids, reasons, workload names) goes in as a
// text node or an attribute value, never as HTML: a job's reason is whatever its submitter wrote.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export const $ = (selector, root = document) => root.querySelector(selector);

export function fmtTime(iso) {
  if (!iso) return "-";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function fmtAgo(iso, now = Date.now()) {
  if (!iso) return "-";
  const s = Math.max(0, Math.round((now - new Date(iso).getTime()) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

export function fmtNum(value, digits = 1) {
  return value === null || value === undefined || Number.isNaN(value) ? "-" : Number(value).toFixed(digits).replace(/\.0+$/, "");
}

export function kv(obj) {
  return Object.entries(obj || {}).map(([k, v]) => `${k}=${typeof v === "number" ? fmtNum(v, 2) : JSON.stringify(v)}`).join("  ");
}
