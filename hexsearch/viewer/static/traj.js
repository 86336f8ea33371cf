// The trajectory page (timeline + token view) and the group page (a group's trajectories side by side).
"use strict";

function toolCall(c) {
  const args = Object.entries(c.args || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ");
  return h("div", { cls: "call" + (c.error ? " err" : ""), "data-tool": c.name },
    h("b", {}, `→ ${c.name}(${args})`), " ",
    h("span", { cls: "muted" }, `${fmt((c.latency_s || 0) * 1000, 0)} ms${c.cached ? ", cached" : ""}${c.cost ? ", $" + fmt(c.cost, 4) : ""}`),
    c.error ? h("div", { cls: "bad" }, "error: ", c.error) : h("div", { cls: "muted" }, "← ", short(c.summary, 300)));
}

function timelineView(events, compact) {
  return h("div", { cls: "timeline" }, events.map(e => {
    if (e.kind === "segment") return h("div", { cls: "ev segment" }, h("b", {}, `segment ${e.segment}`), " — ", e.text);
    if (e.kind === "turn") {
      return h("div", { cls: "ev turn", "data-turn": e.turn },
        h("div", { cls: "meta" }, `turn ${e.turn}`, e.call ? ` (${e.call})` : "", ` — ${e.tokens} generated tokens`,
          e.finish ? `, finish ${e.finish}` : "", e.llm_s !== null && e.llm_s !== undefined ? `, ${fmt(e.llm_s, 2)} s` : ""),
        h("pre", {}, e.text), (e.tool_calls || []).map(toolCall));
    }
    const label = e.kind === "prompt" ? `prompt (${e.tokens} tokens)` : `what the model saw next (${e.tokens} tokens)`;
    if (compact) return h("details", { cls: "ev context" }, h("summary", {}, label), h("pre", {}, e.text));
    return h("details", { cls: "ev context", open: e.kind !== "prompt" }, h("summary", {}, label), h("pre", {}, e.text));
  }));
}

const SCALES = {
  mask: { label: "loss mask: trained (blue) / not trained", color: (t) => t.mask ? "rgba(37,99,235,0.28)" : "" },
  logprob: { label: "behaviour log-prob: -5 (red) … 0 (green)", color: (t) => {
    if (!t.mask) return "";
    const x = Math.max(0, Math.min(1, (t.logprob + 5) / 5));
    return `hsla(${Math.round(120 * x)}, 75%, 50%, 0.45)`;
  } },
  version: { label: "weight version: oldest (light) … newest (dark)", color: (t, lo, hi) => {
    if (!t.mask) return "";
    const x = hi > lo ? (t.version - lo) / (hi - lo) : 1;
    return `hsla(265, 70%, ${Math.round(85 - 45 * x)}%, 0.8)`;
  } },
};

function tokenView(tv, scale) {
  const all = tv.segments.flatMap(s => s.versions.filter((v, i) => s.mask[i]));
  const lo = all.length ? Math.min(...all) : 0, hi = all.length ? Math.max(...all) : 0;
  const box = h("div", { cls: "tokens", id: "token-view", "data-scale": scale });
  tv.segments.forEach((s, si) => {
    if (si > 0 || tv.segments.length > 1) box.append(h("span", { cls: "segline", "data-segment": si }, `segment ${si} (${s.ids.length} tokens)`));
    s.ids.forEach((id, i) => {
      const t = { mask: s.mask[i], logprob: s.logprobs[i], version: s.versions[i] };
      const el = h("span", { cls: "tok" + (t.mask ? " trained" : ""),
        title: `id ${id} | mask ${t.mask}` + (t.mask ? ` | logprob ${fmt(t.logprob, 3)} | version ${t.version}` : "") }, s.text[i]);
      const c = SCALES[scale].color(t, lo, hi);
      if (c) el.style.backgroundColor = c;
      box.append(el);
    });
  });
  return { box, lo, hi };
}

function tokenSection(tv) {
  const holder = h("div", {});
  const draw = (scale) => {
    const { box, lo, hi } = tokenView(tv, scale);
    const buttons = Object.keys(SCALES).map(k => h("button", { id: `scale-${k}`, cls: k === scale ? "on" : "", onclick: () => draw(k) }, k));
    holder.replaceChildren(
      h("div", { cls: "filters" }, buttons, h("span", { cls: "legend" }, SCALES[scale].label, scale === "version" ? ` (v${lo}…v${hi})` : "")),
      h("p", { cls: "muted" }, h("span", { id: "trained-count" }, tv.trained), ` trained tokens of ${tv.tokens}`,
        tv.cut ? " (the view is cut: the trajectory is very long)" : ""), box);
  };
  draw("mask");
  return holder;
}

function rewardParts(info) {
  return Object.entries(info || {}).map(([k, v]) => [k, typeof v === "boolean" ? String(v) : v]).filter(([, v]) => typeof v !== "object");
}

HX.pages.traj = async ({ id, q }) => {
  const [s, d] = await Promise.all([api(`run/${id}`), api(`run/${id}/trajectory?` + qs({ file: q.file, n: q.n, key: q.key }))]);
  const t = d.head;
  crumbs([s.name, `#run/${id}`], [`${d.file}:${d.line}`]);
  const group = t.group_id && t.group_id !== "eval" ? h("a", { href: `#group/${id}?${qs({ file: d.file, group: t.group_id })}` }, `group ${t.group_id}`) : null;
  return h("div", {},
    h("h1", {}, t.question),
    h("div", { cls: "muted" }, `${d.file} line ${d.line} — question ${t.question_id}`, t.meta.step !== undefined ? ` — step ${t.meta.step}` : "", " ", group),
    cards([["reward", t.reward], ["prediction", t.prediction ?? "(none)"], ["gold", (t.gold || []).join(" | ")], ["stop reason", t.stop_reason],
           ["turns", t.num_turns], ["format errors", t.format_errors], ["seconds", (t.timings || {}).total]]),
    h("h3", {}, "Reward parts"), cards(rewardParts(t.reward_info)),
    d.tokenizer_problem ? h("div", { cls: "errors" }, d.tokenizer_problem, " — token ids are shown instead of text.") : null,
    h("h2", {}, "Timeline"), timelineView(d.timeline, false),
    h("h2", {}, "Tokens"), tokenSection(d.tokens));
};

HX.pages.group = async ({ id, q }) => {
  const [s, g] = await Promise.all([api(`run/${id}`), api(`run/${id}/group?` + qs({ file: q.file, group: q.group }))]);
  crumbs([s.name, `#run/${id}`], [`group ${g.group}`]);
  return h("div", {},
    h("h1", {}, `Group ${g.group}`),
    h("p", {}, `${g.members.length} trajectories, rewards ${g.rewards.map(r => fmt(r, 2)).join(", ")}; advantages by ${g.estimator}; `,
      h("span", { id: "group-signal", cls: g.signal ? "good" : "warn" }, g.signal ? "the rewards differ: this group trains"
        : "all rewards are equal: no signal (dynamic filtering drops this group)")),
    h("div", { cls: "grid", id: "group-grid" }, g.members.map(m => h("div", { cls: "col", "data-member": m.n },
      h("div", {}, h("a", { href: `#traj/${id}?${qs({ file: g.file, n: m.n })}` }, `line ${m.n + 1}`), " ",
        h("span", { cls: "pill" }, `reward ${fmt(m.head.reward, 2)}`), " ",
        h("span", { cls: "pill " + (m.advantage > 0 ? "pos" : m.advantage < 0 ? "neg" : ""), "data-advantage": m.advantage }, `advantage ${fmt(m.advantage, 2)}`)),
      h("div", { cls: "muted" }, `${m.head.stop_reason}; prediction: ${m.head.prediction ?? "(none)"}; ${m.trained} trained tokens`),
      timelineView(m.timeline.filter(e => e.kind !== "prompt"), true)))));
};
