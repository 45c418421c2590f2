// The engine view: GET /v1/engine/events (this key's view of the queue, the slot and the cache tiers),
// reconnecting when the connection is lost.
import * as api from "./api.js";
import { el } from "./bar.js";

const $ = (id) => document.getElementById(id);

const bytes = (n) => {
  if (n == null) return "no limit";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n >= 10 || i === 0 ? Math.round(n) : n.toFixed(1)} ${units[i]}`;
};

export class Engine {
  constructor() {
    this.ctrl = null;
    this.retry = 500;
    this.last = null;
    this.onUpdate = null; // (snapshot) => void
  }

  start() {
    this.stopped = false;
    this.loop();
  }

  restart() {
    if (this.ctrl) this.ctrl.abort();
    this.retry = 500;
  }

  state(text, cls) {
    const b = $("engine-state");
    b.textContent = text;
    b.className = `badge ${cls || ""}`;
  }

  async loop() {
    while (!this.stopped) {
      this.ctrl = new AbortController();
      try {
        this.state("connecting");
        const res = await api.call("/v1/engine/events", { signal: this.ctrl.signal });
        this.state("live", "ok");
        this.retry = 500;
        for await (const { event, data } of api.events(res)) {
          if (event === "engine") this.render(data);
        }
        this.state("reconnecting", "warn");
      } catch (e) {
        this.state(e.name === "AbortError" ? "reconnecting" : "offline, retrying", "warn");
      }
      await new Promise((r) => setTimeout(r, this.retry));
      this.retry = Math.min(this.retry * 2, 8000);
    }
  }

  render(s) {
    this.last = s;
    const slot = $("slot");
    slot.replaceChildren();
    const r = s.running;
    if (!r) {
      slot.append(el("span", "muted", "idle"));
      slot.dataset.phase = "idle";
    } else {
      slot.dataset.phase = r.phase;
      slot.append(el("div", "slot-who", r.own ? `${r.session} · ${r.kind}` : `another key's request · ${r.kind}`));
      const ph = el("div", `phase ph-${r.phase}`, r.phase);
      slot.append(ph);
      if (r.own && r.total) {
        const track = el("div", "track progress");
        const cached = el("span", "seg cached");
        cached.style.flexGrow = String(r.cached / r.total);
        const done = el("span", "seg prefilled");
        done.style.flexGrow = String(Math.max(0, r.done - r.cached) / r.total);
        const rest = el("span", "seg rest");
        rest.style.flexGrow = String(Math.max(0, r.total - r.done) / r.total);
        track.append(cached, done, rest);
        slot.append(track);
        const line = r.phase === "decoding"
          ? `${r.total} prompt tokens (${r.cached} cached) · ${r.generated} generated`
          : `prefill ${r.done} / ${r.total} (${r.cached} cached)`;
        slot.append(el("div", "small muted", line));
      }
    }
    const q = $("queue");
    q.replaceChildren();
    for (const w of s.queue) {
      const li = el("li", w.own ? "own" : "other", w.own ? `${w.session} · ${w.kind}` : `another key's request · ${w.kind}`);
      if (w.own) li.title = `waiting ${w.waited.toFixed(1)} s`;
      q.append(li);
    }
    $("queue-empty").hidden = s.queue.length > 0;
    const tiers = $("tiers");
    tiers.replaceChildren();
    tiers.append(tier("RAM", s.ram), tier("disk", s.disk));
    if (s.shared_blocks) tiers.append(el("div", "small muted", `shared prefix blocks of ${s.shared_blocks} cells`));
    tiers.append(el("div", "small muted", `slot holds ${s.slot_tokens} tokens`));
    const loc = $("locations");
    loc.replaceChildren();
    const entries = Object.entries(s.sessions);
    for (const [sid, where] of entries) {
      const li = el("li");
      li.dataset.session = sid;
      li.append(el("span", "sid", sid), el("span", `source src-${where}`, where));
      loc.append(li);
    }
    if (!entries.length) loc.append(el("li", "muted", "none of your sessions has run yet"));
    if (this.onUpdate) this.onUpdate(s);
  }
}

function tier(name, t) {
  const box = el("div", "tier");
  if (!t) {
    box.append(el("div", "tier-name", name), el("div", "small muted", "off"));
    return box;
  }
  box.append(el("div", "tier-name", `${name}: ${t.entries} state${t.entries === 1 ? "" : "s"}`));
  const track = el("div", "track");
  const used = el("span", "seg cached");
  const limit = t.limit || Math.max(t.stored, 1) * 2;
  used.style.flexGrow = String(Math.min(1, t.stored / limit));
  const free = el("span", "seg rest");
  free.style.flexGrow = String(Math.max(0, 1 - t.stored / limit));
  track.append(used, free);
  box.append(track);
  let text = `${bytes(t.stored)} of ${bytes(t.limit)}`;
  if (t.bytes > t.stored) text += ` · ${bytes(t.bytes - t.stored)} saved by shared blocks`;
  if (t.blocks) text += ` · ${t.blocks} blocks`;
  box.append(el("div", "small muted", text));
  return box;
}
