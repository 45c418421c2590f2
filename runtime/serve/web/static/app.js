// The page: asks for the API key once (sessionStorage), then the chat, the agents room and the engine view.
import * as api from "./api.js";
import { Chat } from "./chat.js";
import { Engine } from "./engine.js";
import { Room } from "./room.js";

const $ = (id) => document.getElementById(id);

// a small modal question; resolves to the answer, or null when cancelled
function ask(title, value = "", help = "", type = "text") {
  const dlg = $("ask");
  $("ask-title").textContent = title;
  $("ask-help").textContent = help;
  const input = $("ask-input");
  input.type = type;
  input.value = value;
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok" ? input.value.trim() : null), { once: true });
    dlg.returnValue = "";
    dlg.showModal();
    input.select();
  });
}

function notice(text, { retry } = {}) {
  const box = $("notice");
  box.replaceChildren();
  box.hidden = !text;
  if (!text) return;
  box.append(document.createTextNode(text));
  if (retry) {
    const b = document.createElement("button");
    b.textContent = "Retry";
    b.addEventListener("click", () => { notice(null); retry(); });
    box.append(" ", b);
  }
}

let asking = null;
async function askKey(title = "Enter the API key of this server (leave empty if it needs none):") {
  if (!asking) {
    asking = (async () => {
      for (;;) {
        const k = await ask(title, "", "Kept in this tab only (sessionStorage).", "password");
        if (k !== null) { api.setKey(k); return; }
      }
    })().finally(() => { asking = null; });
  }
  return asking;
}
api.onKeyNeeded(askKey);

function show(view) {
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.view === view);
  $("view-chat").hidden = view !== "chat";
  $("view-room").hidden = view !== "room";
}

async function main() {
  const chat = new Chat({ ask, notice });
  const engine = new Engine();
  new Room({ onSessions: () => chat.refreshSessions().catch(() => {}) });
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => show(tab.dataset.view));
  $("change-key").addEventListener("click", async () => {
    api.forgetKey();
    await askKey();
    await start();
    engine.restart();
  });

  async function start() {
    if (sessionStorage.getItem("turnstile.key") === null) await askKey();
    const models = await api.json("/v1/models"); // a 401 asks for the key again
    $("model").textContent = models.data?.[0]?.id || "";
    const ids = await chat.refreshSessions();
    const last = localStorage.getItem("turnstile.last");
    if (!chat.sid && last && ids.includes(last)) await chat.open(last);
    else await chat.reload();
    document.body.dataset.ready = "1";
  }

  try {
    await start();
  } catch (e) {
    notice(api.describe(e));
  }
  engine.start();
}

main();
