// The console's only way to the cluster: the HTTP API with the operator's bearer token, and its
// change stream (server-sent events; EventSource sends no headers, so the token goes as
// ?access_token=, which the stream endpoint alone accepts). The token is kept in this tab's
// sessionStorage (gone when the tab closes); ?token= in the address logs in and is removed from it.

const KEY = "hivemux.token";

export function takeTokenFromUrl() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token) {
    sessionStorage.setItem(KEY, token);
    url.searchParams.delete("token");
    window.history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
}

export const token = () => sessionStorage.getItem(KEY);
export const setToken = (value) => sessionStorage.setItem(KEY, value.trim());
export const forgetToken = () => sessionStorage.removeItem(KEY);

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
    this.detail = detail;
  }
}

export async function api(path, { method = "GET", body } = {}) {
  const headers = { Authorization: `Bearer ${token()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!response.ok) throw new ApiError(response.status, data && data.detail !== undefined ? data.detail : data);
  return data;
}

// Subscribe to the change stream. onHello(hello) after each (re)connect: reload the snapshot;
// onChange(batch); onStatus("live" | "reconnecting"). EventSource reconnects by itself.
export function subscribe({ onHello, onChange, onMetrics, onRevoked, onStatus }) {
  const source = new EventSource(`/api/v1/stream?access_token=${encodeURIComponent(token())}`);
  source.addEventListener("hello", (e) => {
    onStatus("live");
    onHello(JSON.parse(e.data));
  });
  source.addEventListener("change", (e) => onChange(JSON.parse(e.data)));
  source.addEventListener("metrics", (e) => onMetrics(JSON.parse(e.data)));
  source.addEventListener("revoked", (e) => { // the token was revoked while the stream was open
    source.close();
    onRevoked(JSON.parse(e.data).detail);
  });
  source.onerror = () => onStatus(source.readyState === EventSource.CLOSED ? "closed" : "reconnecting");
  return source;
}
