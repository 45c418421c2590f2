// The server's HTTP API as the page uses it: the key (asked once, kept in sessionStorage), JSON calls and
// server-sent event streams read with fetch (EventSource cannot send the key in a header).

const KEY = "turnstile.key";

export class ApiError extends Error {
  constructor(status, message, body, retryAfter) {
    super(message);
    this.status = status;
    this.body = body;
    this.retryAfter = retryAfter;
  }
}

let askKey = null; // set by the app: async () => key (shows the key dialog)

export function onKeyNeeded(fn) { askKey = fn; }
export function key() { return sessionStorage.getItem(KEY) || ""; }
export function setKey(value) { sessionStorage.setItem(KEY, value); }
export function forgetKey() { sessionStorage.removeItem(KEY); }

function headers(extra) {
  const h = { ...extra };
  const k = key();
  if (k) h["Authorization"] = `Bearer ${k}`;
  return h;
}

async function failure(res) {
  let body = null;
  try { body = await res.json(); } catch { /* not JSON */ }
  const message = body?.error?.message || `${res.status} ${res.statusText}`;
  const retry = Number(res.headers.get("retry-after") || 0) || null;
  return new ApiError(res.status, message, body, retry);
}

// fetch with the key; a 401 asks for the key again and retries once
export async function call(path, { method = "GET", body, signal, extraHeaders } = {}) {
  for (let attempt = 0; ; attempt++) {
    const init = { method, signal, headers: headers(extraHeaders) };
    if (body !== undefined) {
      init.body = typeof body === "string" ? body : JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    const res = await fetch(path, init);
    if (res.status === 401 && attempt === 0 && askKey) {
      forgetKey();
      await askKey("That key was not accepted. Enter the API key:");
      continue;
    }
    if (!res.ok) throw await failure(res);
    return res;
  }
}

export async function json(path, opts) {
  const res = await call(path, opts);
  return res.json();
}

// read a text/event-stream body: yields {event, data} (data parsed as JSON, or the raw string)
export async function* events(res) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let name = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) name = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
        if (!data.length) continue;
        const text = data.join("\n");
        let parsed = text;
        try { parsed = JSON.parse(text); } catch { /* [DONE] */ }
        yield { event: name, data: parsed };
      }
    }
  } finally {
    reader.releaseLock();
  }
}

export function describe(err) {
  if (err?.name === "AbortError") return "stopped";
  if (err instanceof ApiError) {
    if (err.status === 429) return `The server's queue is full: retry in ${err.retryAfter || 1} s.`;
    if (err.status === 503) return `The server is not ready: ${err.message}`;
    return err.message;
  }
  return `Lost the connection to the server (${err?.message || err}).`;
}
