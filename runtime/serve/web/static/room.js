// The agents room: POST /v1/rooms streams a round table (or a debate) as the agents speak in turn.
import * as api from "./api.js";
import { el, turnBar } from "./bar.js";

const $ = (id) => document.getElementById(id);
const COLOURS = ["#2f6fde", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490"];

export class Room {
  constructor({ onSessions }) {
    this.ctrl = null;
    this.onSessions = onSessions;
    $("room-form").addEventListener("submit", (e) => { e.preventDefault(); this.start(); });
    $("room-stop").addEventListener("click", () => this.stop());
  }

  request() {
    const f = $("room-form").elements;
    const body = {
      mode: f.mode.value,
      topic: f.topic.value,
      rounds: Number(f.rounds.value),
      max_tokens: Number(f.max_tokens.value),
      temperature: Number(f.temperature.value),
    };
    const personas = f.personas.value.split("\n").map((l) => l.trim()).filter(Boolean).map((line) => {
      const at = line.indexOf(":");
      return { name: line.slice(0, at).trim(), system: line.slice(at + 1).trim() };
    });
    if (personas.length) body.personas = personas; else body.agents = Number(f.agents.value);
    return body;
  }

  status(text) { $("room-status").textContent = text; }

  async start() {
    if (this.ctrl) return;
    const ctrl = new AbortController();
    this.ctrl = ctrl;
    $("room-start").disabled = true;
    $("room-stop").disabled = false;
    const box = $("room-turns");
    box.replaceChildren();
    const cards = [];
    const colour = {};
    this.status("starting…");
    try {
      const res = await api.call("/v1/rooms", { method: "POST", body: this.request(), signal: ctrl.signal });
      for await (const { event, data } of api.events(res)) {
        if (event === "room") {
          data.agents.forEach((a, i) => { colour[a.name] = COLOURS[i % COLOURS.length]; });
          this.status(`${data.mode.replace("_", " ")} on ${data.topic}: ${data.agents.map((a) => a.name).join(", ")}`);
          if (this.onSessions) this.onSessions();
        } else if (event === "turn") {
          const card = el("div", "msg assistant turn");
          card.dataset.testid = "room-turn";
          card.dataset.agent = data.agent;
          card.dataset.index = String(data.index);
          const who = el("div", "who", `${data.agent} · round ${data.round}`);
          who.style.color = colour[data.agent];
          card.style.borderLeftColor = colour[data.agent];
          const asked = el("details", "asked");
          asked.append(el("summary", null, "what it was asked"), el("div", "text small", data.message));
          const text = el("div", "text");
          text.dataset.testid = "turn-text";
          card.append(who, asked, text);
          card.classList.add("live");
          box.append(card);
          cards[data.index] = { card, text };
          card.scrollIntoView({ block: "end" });
        } else if (event === "delta") {
          cards[data.index].text.textContent += data.text;
        } else if (event === "done") {
          const { card, text } = cards[data.index];
          text.textContent = data.text;
          card.classList.remove("live");
          card.dataset.done = "1";
          card.append(turnBar(data.stats));
        } else if (event === "end") {
          this.status(`done: ${data.turns} turns`);
        } else if (event === "error") {
          this.status(`stopped: ${data.error?.message}`);
        }
      }
    } catch (e) {
      this.status(e.name === "AbortError" ? "stopped: the turn in progress was cancelled" : api.describe(e));
    } finally {
      this.ctrl = null;
      $("room-start").disabled = false;
      $("room-stop").disabled = true;
      if (this.onSessions) this.onSessions();
    }
  }

  stop() {
    if (this.ctrl) this.ctrl.abort();
  }
}
