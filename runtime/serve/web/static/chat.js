// The chat view: the key's sessions, one conversation, streamed turns, history operations.
import * as api from "./api.js";
import { el, fromTimings, turnBar } from "./bar.js";

const $ = (id) => document.getElementById(id);
const KEEP = ["role", "content", "tool_calls", "tool_call_id", "reasoning_content", "name"];

export class Chat {
  constructor({ ask, notice }) {
    this.ask = ask; // (title, default, help) => Promise<string|null>
    this.notice = notice; // (text, {retry}) => void
    this.sid = null;
    this.messages = [];
    this.streaming = null; // AbortController of the running turn
    this.wire();
  }

  // --- sessions ----------------------------------------------------------------------------------

  async refreshSessions() {
    const list = await api.json("/v1/sessions");
    const ul = $("sessions");
    ul.replaceChildren();
    for (const s of list.data) {
      const li = el("li", s.id === this.sid ? "active" : "", s.id);
      li.dataset.session = s.id;
      li.title = s.id;
      li.addEventListener("click", () => this.open(s.id));
      ul.append(li);
    }
    if (!list.data.length) ul.append(el("li", "muted empty", "no sessions yet"));
    return list.data.map((s) => s.id);
  }

  async open(sid) {
    if (this.streaming) return;
    this.sid = sid;
    this.notice(null);
    localStorage.setItem("turnstile.last", sid);
    await this.reload();
    await this.refreshSessions();
    this.loadSettings();
    $("input").focus();
  }

  async reload() {
    if (!this.sid) {
      this.messages = [];
      $("chat-title").textContent = "No session";
    } else {
      try {
        const s = await api.json(`/v1/sessions/${encodeURIComponent(this.sid)}`);
        this.messages = s.messages || [];
      } catch (e) {
        if (e.status === 404) { this.messages = []; } else throw e;
      }
      $("chat-title").textContent = this.sid;
    }
    this.render();
  }

  async create() {
    const n = new Date().toISOString().slice(5, 19).replace(/[-T:]/g, "");
    const name = await this.ask("New session: its name", `chat-${n}`, "letters, digits and . _ : - (up to 128)");
    if (!name) return;
    await this.guard(async () => {
      await api.json("/v1/sessions", { method: "POST", body: { id: name } });
      await this.open(name);
    });
  }

  // --- messages ----------------------------------------------------------------------------------

  bars() {
    try { return JSON.parse(sessionStorage.getItem(`turnstile.bars.${this.sid}`) || "{}"); } catch { return {}; }
  }

  saveBar(index, stats) {
    const all = this.bars();
    all[index] = stats;
    sessionStorage.setItem(`turnstile.bars.${this.sid}`, JSON.stringify(all));
  }

  render() {
    const box = $("messages");
    box.replaceChildren();
    const bars = this.bars();
    this.messages.forEach((m, i) => box.append(this.bubble(m, i, bars[i])));
    if (!this.messages.length) box.append(el("p", "muted empty", this.sid ? "Say something." : "Create a session or pick one on the left."));
    box.scrollTop = box.scrollHeight;
    const none = !this.sid;
    for (const id of ["btn-rename", "btn-fork", "btn-undo", "btn-regen", "btn-export", "btn-delete"]) $(id).disabled = none;
  }

  bubble(m, i, stats) {
    const b = el("div", `msg ${m.role}`);
    b.dataset.testid = `msg-${m.role}`;
    b.dataset.index = String(i);
    const head = el("div", "who", m.role === "assistant" ? "assistant" : m.role);
    b.append(head);
    if (m.reasoning_content) {
      const d = el("details", "reasoning");
      d.append(el("summary", null, "reasoning"), el("div", "text", m.reasoning_content));
      b.append(d);
    }
    const text = el("div", "text", typeof m.content === "string" ? m.content : JSON.stringify(m.content));
    text.dataset.testid = "msg-text";
    b.append(text);
    for (const c of m.tool_calls || []) b.append(toolCard(c.function?.name, c.function?.arguments, c.id));
    if (m.role === "user") {
      const edit = el("button", "link small", "edit");
      edit.dataset.testid = "edit";
      edit.addEventListener("click", () => this.startEdit(b, i));
      head.append(edit);
    }
    if (stats) b.append(turnBar(stats));
    return b;
  }

  startEdit(bubble, i) {
    if (this.streaming) return;
    const area = el("textarea", "edit-area");
    area.value = this.messages[i].content;
    const save = el("button", null, "Save and answer");
    const cancel = el("button", null, "Cancel");
    const text = bubble.querySelector(".text");
    text.replaceWith(area);
    const row = el("div", "row");
    row.append(save, cancel);
    bubble.append(row);
    area.focus();
    cancel.addEventListener("click", () => this.render());
    save.addEventListener("click", () => {
      const kept = this.messages.slice(0, i).concat([{ role: "user", content: area.value }]);
      this.turn(kept, null);
    });
  }

  // --- turns -------------------------------------------------------------------------------------

  settings() {
    const raw = JSON.parse(localStorage.getItem(`turnstile.settings.${this.sid}`) || "{}");
    const out = {};
    for (const k of ["temperature", "top_p", "max_tokens", "seed"]) if (raw[k] !== undefined && raw[k] !== "") out[k] = Number(raw[k]);
    if (raw.reasoning === "off") out.reasoning_effort = "none";
    if (raw.reasoning === "on") out.chat_template_kwargs = { enable_thinking: true };
    if (raw.reasoning_budget !== undefined && raw.reasoning_budget !== "") out.reasoning_budget_tokens = Number(raw.reasoning_budget);
    return out;
  }

  loadSettings() {
    const raw = JSON.parse(localStorage.getItem(`turnstile.settings.${this.sid}`) || "{}");
    for (const input of $("settings").elements) input.value = raw[input.name] ?? "";
  }

  storeSettings() {
    if (!this.sid) return;
    const raw = {};
    for (const input of $("settings").elements) if (input.name && input.value !== "") raw[input.name] = input.value;
    localStorage.setItem(`turnstile.settings.${this.sid}`, JSON.stringify(raw));
  }

  async send() {
    const input = $("input");
    const text = input.value;
    if (!text.trim() || this.streaming) return;
    if (!this.sid) {
      const name = `chat-${new Date().toISOString().slice(5, 19).replace(/[-T:]/g, "")}`;
      const ok = await this.guard(async () => {
        await api.json("/v1/sessions", { method: "POST", body: { id: name } });
        this.sid = name;
        await this.refreshSessions();
        return true;
      });
      if (!ok) return;
    }
    input.value = "";
    await this.turn(this.messages.concat([{ role: "user", content: text }]), text);
  }

  async regenerate() {
    let last = this.messages.length - 1;
    while (last >= 0 && this.messages[last].role !== "user") last--;
    if (last < 0) return this.notice("Nothing to regenerate: no user message yet.");
    await this.turn(this.messages.slice(0, last + 1), null);
  }

  // run one turn: `wanted` is the conversation to answer (its last message the user's)
  async turn(wanted, typed) {
    const ctrl = new AbortController();
    this.streaming = ctrl;
    this.notice(null);
    this.setBusy(true);
    const box = $("messages");
    this.messages = wanted;
    this.render();
    const live = this.bubble({ role: "assistant", content: "" }, wanted.length);
    live.classList.add("live");
    live.dataset.testid = "msg-live";
    box.append(live);
    const text = live.querySelector(".text");
    let reasoning = null;
    const calls = [];
    let stats = null;
    let usage = null;
    const body = { messages: wanted.map(clean), stream: true, stream_options: { include_usage: true }, ...this.settings() };
    try {
      const res = await api.call("/v1/chat/completions", {
        method: "POST", body, signal: ctrl.signal, extraHeaders: { "X-Session-Id": this.sid },
      });
      for await (const { data } of api.events(res)) {
        if (data === "[DONE]") break;
        if (data.error) throw new api.ApiError(500, data.error.message, data);
        if (data.usage) usage = data.usage;
        const choice = data.choices?.[0];
        if (!choice) continue;
        const d = choice.delta || {};
        if (d.reasoning_content) {
          if (!reasoning) {
            const det = el("details", "reasoning");
            det.open = true;
            reasoning = el("div", "text");
            det.append(el("summary", null, "reasoning"), reasoning);
            text.before(det);
          }
          reasoning.textContent += d.reasoning_content;
        }
        if (d.content) text.textContent += d.content;
        for (const t of d.tool_calls || []) {
          if (!calls[t.index]) { calls[t.index] = { name: t.function?.name || "", args: "", card: null }; }
          calls[t.index].args += t.function?.arguments || "";
          const card = toolCard(calls[t.index].name, calls[t.index].args, t.id);
          if (calls[t.index].card) calls[t.index].card.replaceWith(card); else live.append(card);
          calls[t.index].card = card;
        }
        if (data.timings) stats = fromTimings(data.timings, null);
        box.scrollTop = box.scrollHeight;
      }
      if (stats) {
        if (usage) stats.prompt = usage.prompt_tokens;
        this.saveBar(wanted.length, stats);
      }
    } catch (e) {
      if (e.name === "AbortError") {
        this.notice("Stopped: the turn was cancelled on the server and nothing was kept.");
      } else {
        this.notice(api.describe(e), e.status === 429 ? { retry: () => this.turn(wanted, typed) } : {});
        if (typed && !$("input").value) $("input").value = typed;
      }
    } finally {
      this.streaming = null;
      this.setBusy(false);
    }
    await this.reload();
  }

  stop() {
    if (this.streaming) this.streaming.abort();
  }

  setBusy(busy) {
    const send = $("send");
    send.textContent = busy ? "Stop" : "Send";
    send.dataset.testid = busy ? "stop" : "send";
    send.classList.toggle("danger", busy);
    for (const id of ["btn-rename", "btn-fork", "btn-undo", "btn-regen", "btn-delete"]) $(id).disabled = busy;
  }

  // --- history operations ------------------------------------------------------------------------

  async guard(fn) {
    try {
      return await fn();
    } catch (e) {
      this.notice(api.describe(e));
      return null;
    }
  }

  path(op) { return `/v1/sessions/${encodeURIComponent(this.sid)}${op ? "/" + op : ""}`; }

  async fork() {
    const name = await this.ask(`Fork ${this.sid} as`, `${this.sid}-fork`);
    if (!name) return;
    await this.guard(async () => {
      await api.json(this.path("fork"), { method: "POST", body: { id: name } });
      this.copyLocal(this.sid, name);
      await this.open(name);
    });
  }

  // a fork or a rename keeps the session's settings and its turns' bars (kept in this browser)
  copyLocal(from, to) {
    const settings = localStorage.getItem(`turnstile.settings.${from}`);
    if (settings) localStorage.setItem(`turnstile.settings.${to}`, settings);
    const bars = sessionStorage.getItem(`turnstile.bars.${from}`);
    if (bars) sessionStorage.setItem(`turnstile.bars.${to}`, bars);
  }

  async undo() {
    await this.guard(async () => {
      await api.json(this.path("undo"), { method: "POST", body: { n: 1 } });
      await this.reload();
    });
  }

  async rename() {
    const name = await this.ask(`Rename ${this.sid} to`, this.sid);
    if (!name || name === this.sid) return;
    await this.guard(async () => {
      await api.json(this.path("rename"), { method: "POST", body: { id: name } });
      this.copyLocal(this.sid, name);
      await this.open(name);
    });
  }

  async remove() {
    const yes = await this.ask(`Delete ${this.sid}? Type its name to confirm.`, "");
    if (yes !== this.sid) return;
    await this.guard(async () => {
      await api.json(this.path(""), { method: "DELETE" });
      this.sid = null;
      await this.reload();
      await this.refreshSessions();
    });
  }

  async exportFile() {
    await this.guard(async () => {
      const doc = await api.json(this.path("export"));
      const a = el("a");
      a.href = URL.createObjectURL(new Blob([JSON.stringify(doc, null, 2)], { type: "application/json" }));
      a.download = `${this.sid}.json`;
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 1000);
    });
  }

  async importFile(file) {
    let doc;
    try { doc = JSON.parse(await file.text()); } catch { return this.notice(`${file.name} is not a JSON session document.`); }
    const suggested = (typeof doc.id === "string" && doc.id) || file.name.replace(/\.json$/, "");
    const name = await this.ask("Import as", suggested);
    if (!name) return;
    await this.guard(async () => {
      await api.json("/v1/sessions/import", { method: "POST", body: { id: name, data: doc } });
      await this.open(name);
    });
  }

  wire() {
    $("new-session").addEventListener("click", () => this.create());
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); this.streaming ? this.stop() : this.send(); });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); if (!this.streaming) this.send(); }
    });
    $("btn-fork").addEventListener("click", () => this.fork());
    $("btn-undo").addEventListener("click", () => this.undo());
    $("btn-regen").addEventListener("click", () => this.regenerate());
    $("btn-rename").addEventListener("click", () => this.rename());
    $("btn-delete").addEventListener("click", () => this.remove());
    $("btn-export").addEventListener("click", () => this.exportFile());
    $("btn-settings").addEventListener("click", () => { $("settings").hidden = !$("settings").hidden; });
    $("settings").addEventListener("input", () => this.storeSettings());
    $("import-file").addEventListener("change", (e) => { const f = e.target.files[0]; e.target.value = ""; if (f) this.importFile(f); });
  }
}

function clean(m) {
  const out = {};
  for (const k of KEEP) if (m[k] !== undefined && m[k] !== null) out[k] = m[k];
  return out;
}

export function toolCard(name, args, id) {
  const card = el("div", "toolcard");
  card.dataset.testid = "toolcard";
  card.append(el("div", "toolname", `tool call: ${name || "…"}`));
  let shown = args || "";
  try { shown = JSON.stringify(JSON.parse(args), null, 2); } catch { /* still streaming */ }
  card.append(el("pre", null, shown));
  if (id) card.title = id;
  return card;
}
