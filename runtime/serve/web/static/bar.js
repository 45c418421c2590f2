// A turn's numbers as one small bar: tokens (cached | prefilled | generated), where the state came from,
// queue wait, time to first token, speeds, and drafted/accepted tokens when speculation ran.

const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

const ms = (v) => (v == null ? "–" : v < 1000 ? `${Math.round(v)} ms` : `${(v / 1000).toFixed(2)} s`);
const rate = (v) => (v ? `${v >= 100 ? Math.round(v) : v.toFixed(1)} t/s` : "–");

// stats: {prompt, cached, prefilled, generated, source, queued_ms, ttft_ms, prefill_per_second, decode_per_second, draft_n, draft_n_accepted}
export function turnBar(s) {
  const bar = el("div", "turnbar");
  bar.dataset.testid = "turnbar";
  bar.dataset.cached = String(s.cached);
  bar.dataset.source = s.source;
  const total = Math.max(1, s.cached + s.prefilled + s.generated);
  const track = el("div", "track");
  for (const [cls, n, label] of [["cached", s.cached, "cached"], ["prefilled", s.prefilled, "prefilled"], ["generated", s.generated, "generated"]]) {
    if (!n) continue;
    const seg = el("span", `seg ${cls}`);
    seg.style.flexGrow = String(n / total);
    seg.title = `${n} ${label}`;
    track.append(seg);
  }
  bar.append(track);
  const facts = el("div", "facts");
  const fact = (label, value, testid) => {
    const f = el("span", "fact");
    f.append(el("b", null, value), ` ${label}`);
    if (testid) f.dataset.testid = testid;
    facts.append(f);
  };
  fact("prompt", String(s.prompt));
  fact("cached", String(s.cached), "bar-cached");
  fact("prefilled", String(s.prefilled));
  fact("generated", String(s.generated));
  const src = el("span", `source src-${s.source}`, s.source);
  src.title = "where the reused state came from";
  src.dataset.testid = "bar-source";
  facts.append(src);
  fact("queued", ms(s.queued_ms));
  fact("TTFT", ms(s.ttft_ms));
  fact("prefill", rate(s.prefill_per_second));
  fact("decode", rate(s.decode_per_second));
  if (s.draft_n) fact("drafted / accepted", `${s.draft_n} / ${s.draft_n_accepted}`);
  bar.append(facts);
  return bar;
}

// the chat completions stream's `timings` (llama-server's names) as a bar's stats
export function fromTimings(t, usage) {
  return {
    prompt: usage?.prompt_tokens ?? t.cache_n + t.prompt_n,
    cached: t.cache_n,
    prefilled: t.prompt_n,
    generated: t.predicted_n,
    source: t.cache_source || "none",
    queued_ms: t.queued_ms,
    ttft_ms: t.ttft_ms,
    prefill_per_second: t.prompt_per_second,
    decode_per_second: t.predicted_per_second,
    draft_n: t.draft_n || 0,
    draft_n_accepted: t.draft_n_accepted || 0,
  };
}

export { el };
