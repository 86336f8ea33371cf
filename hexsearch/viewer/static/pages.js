// Run pages: train (curves, rollout metrics, tool statistics), eval (per-question table), datagen
// (accepted and rejected items), ask; and the paged trajectory browser every kind of run has.
"use strict";

function series(metrics, key) {
  return metrics.filter(m => typeof m[key] === "number").map(m => [m.step, m[key]]);
}

// ASearcher's figure: tool calls per episode and accuracy over steps, one line per difficulty bucket
// (`agent/tool_calls/<bucket>`, `train/accuracy/<bucket>`: hops2, n8, ...); nothing when none was logged.
function bucketCharts(m) {
  const names = [...new Set(m.flatMap(r => Object.keys(r)).filter(k => k.startsWith("agent/tool_calls/"))
    .map(k => k.slice("agent/tool_calls/".length)))]
    .sort((a, b) => a[0].localeCompare(b[0]) || parseInt(a.replace(/\D/g, "")) - parseInt(b.replace(/\D/g, "")));
  if (!names.length) return [];
  return [h("h2", {}, "Search by difficulty"),
    h("div", { cls: "charts" },
      lineChart("tool calls per episode", names.map(b => ({ name: b, points: series(m, `agent/tool_calls/${b}`) }))),
      lineChart("accuracy (sampled)", names.map(b => ({ name: b, points: series(m, `train/accuracy/${b}`) }))))];
}

function trainSection(s) {
  const m = s.metrics || [], res = s.results || {}, last = [...m].reverse().find(r => "train/reward" in r) || {};
  // Maps, never plain objects, for names that come from the run's files: a key such as "__proto__" would
  // otherwise reach Object.prototype and change every object of the page.
  const stale = new Map();
  m.forEach(r => Object.entries(r["rollout/staleness_hist"] || {}).forEach(([k, v]) => stale.set(k, (stale.get(k) || 0) + v)));
  const tools = new Map();
  Object.entries(last).forEach(([k, v]) => {
    const p = k.split("/");
    if (p[0] !== "tools" || p.length !== 3) return;
    if (!tools.has(p[1])) tools.set(p[1], new Map([["tool", p[1]]]));
    tools.get(p[1]).set(p[2], v);
  });
  const toolRows = [...tools.values()].map(t => Object.assign(Object.create(null), Object.fromEntries(t)));
  const steps = m.filter(r => "train/reward" in r).length;
  return h("div", {},
    cards([["steps logged", steps], ["dev reward before", res.dev_reward_before], ["dev reward after", res.dev_reward_after],
           ["minutes", res.minutes], ["last train reward", last["train/reward"]], ["accepted groups", last["rollout/accepted"]]]),
    h("h2", {}, "Reward"),
    h("div", { cls: "charts" },
      lineChart("reward", [{ name: "train reward (sampled)", points: series(m, "train/reward") },
                           { name: "dev reward (eval)", points: series(m, "eval/reward"), dots: true }]),
      lineChart("accuracy", [{ name: "train accuracy", points: series(m, "train/accuracy") },
                             { name: "dev accuracy", points: series(m, "eval/accuracy"), dots: true }])),
    ...bucketCharts(m),
    h("h2", {}, "Rollouts"),
    h("div", { cls: "charts" },
      barChart("staleness (versions behind, all steps)", [...stale.entries()].sort((a, b) => a[0] - b[0])),
      lineChart("queue depth / running", [{ name: "queue depth", points: series(m, "rollout/queue_depth") },
                                          { name: "running", points: series(m, "rollout/running") }]),
      lineChart("kept groups per step", [{ name: "kept groups", points: series(m, "train/kept_groups") }]),
      lineChart("tokens / s", [{ name: "train tokens/s", points: series(m, "train/tokens_per_s") },
                               { name: "generated tokens/s", points: series(m, "rollout/gen_tokens_per_s") }]),
      lineChart("staleness mean / max", [{ name: "mean", points: series(m, "rollout/staleness_mean") },
                                         { name: "max", points: series(m, "rollout/staleness_max") }])),
    h("h2", {}, "Tools (cumulative, last step)"),
    toolRows.length ? table(["tool", "calls", "ok", "errors", "cache_hits", "retries", "timeouts",
      "latency_p50_s", "latency_p90_s", "cost"].map(k => ({ label: k, key: k, num: k !== "tool" })), toolRows)
      : h("p", { cls: "muted" }, "no tool statistics in metrics.jsonl"));
}

const TABLE_ROWS = 2000;
const capped = rows => rows.length > TABLE_ROWS ? ` (the first ${TABLE_ROWS} shown: filter to see the rest)` : "";

function evalSection(s, q, id) {
  const rows = s.rows || [], overall = (s.report || {}).overall || {};
  const level = r => (r.item_meta || {}).level ?? (r.item_meta || {}).hops ?? "";
  const suite = r => (r.item_meta || {}).source || s.suite || "";
  const uniq = f => [...new Set(rows.map(f).filter(v => v !== ""))].sort();
  const keep = rows.filter(r => (!q.correct || String(!!r.correct) === (q.correct === "yes" ? "true" : "false"))
    && (!q.level || String(level(r)) === q.level) && (!q.suite || suite(r) === q.suite) && (!q.stop || r.stop_reason === q.stop));
  const sel = (name, values, label) => h("label", {}, label + " ", h("select", { id: `f-${name}`, onchange: e => go("run", id, { ...q, [name]: e.target.value }) },
    h("option", { value: "" }, "all"), values.map(v => h("option", { value: v, selected: q[name] === String(v) }, v))));
  return h("div", {},
    h("h2", {}, `Report${s.suite ? " — " + s.suite : ""}`),
    cards(Object.entries(overall).filter(([, v]) => typeof v === "number").slice(0, 10)),
    h("h2", {}, "Questions"),
    h("div", { cls: "filters" }, sel("correct", ["yes", "no"], "correct"), sel("suite", uniq(suite), "suite"),
      sel("level", uniq(level), "level"), sel("stop", uniq(r => r.stop_reason), "stop reason"),
      h("span", { id: "eval-count", cls: "muted" }, `${keep.length} of ${rows.length} samples` + capped(keep))),
    table([
      { label: "id", cell: r => h("a", { href: `#traj/${id}?${qs({ file: "eval.jsonl", key: `${r.id}/${r.sample}` })}` }, `${r.id}/${r.sample}`) },
      { label: "question", cell: r => short(r.question, 100) }, { label: "gold", cell: r => short((r.gold || []).join(" | "), 40) },
      { label: "prediction", cell: r => short(r.prediction ?? "(none)", 40) },
      { label: "correct", cell: r => h("span", { cls: r.correct ? "good" : "bad" }, r.correct ? "yes" : "no") },
      { label: "level", cell: level }, { label: "stop", key: "stop_reason" },
      { label: "turns", key: "turns", num: true }, { label: "tools", key: "tool_calls", num: true },
      { label: "s", key: "seconds", num: true },
    ], keep.slice(0, TABLE_ROWS), r => ({ cls: r.correct ? "correct" : "incorrect", "data-row": "eval" })));
}

function datagenSection(s, q, id) {
  const items = s.items || [], rep = s.report || {};
  const stage = r => (r.reason || "").split(":")[0];
  const keep = items.filter(r => (!q.status || r.status === q.status) && (!q.stage || stage(r) === q.stage));
  const stages = [...new Set(items.map(stage).filter(Boolean))].sort();
  return h("div", {},
    cards(Object.entries(rep).filter(([, v]) => typeof v === "number").slice(0, 10)),
    h("h2", {}, "Items"),
    h("div", { cls: "filters" },
      h("label", {}, "status ", h("select", { id: "f-status", onchange: e => go("run", id, { ...q, status: e.target.value }) },
        ["", "accepted", "rejected", "error"].map(v => h("option", { value: v, selected: (q.status || "") === v }, v || "all")))),
      h("label", {}, "rejected at ", h("select", { id: "f-stage", onchange: e => go("run", id, { ...q, stage: e.target.value }) },
        h("option", { value: "" }, "any"), stages.map(v => h("option", { value: v, selected: q.stage === v }, v)))),
      h("span", { id: "item-count", cls: "muted" }, `${keep.length} of ${items.length} items` + capped(keep))),
    table([
      { label: "#", cell: r => h("a", { href: `#item/${id}?index=${r.index}` }, r.index) },
      { label: "status", cell: r => h("span", { cls: r.status === "accepted" ? "good" : "bad" }, r.status) },
      { label: "reason", cell: r => r.reason || "" }, { label: "question", cell: r => short(r.question, 110) },
      { label: "answer", cell: r => short(r.answer, 40) }, { label: "hops", key: "hops", num: true },
      { label: "difficulty", key: "difficulty" }, { label: "edits", key: "edits", num: true },
    ], keep.slice(0, TABLE_ROWS), r => ({ "data-row": "item", cls: r.status })));
}

async function trajectoryBrowser(s, q, id) {
  const files = s.trajectory_files;
  if (!files.length) return h("p", { cls: "muted" }, "no trajectories/ in this run");
  const file = files.includes(q.file) ? q.file : files[0];
  const offset = +q.offset || 0, limit = 50;
  const page = await api(`run/${id}/trajectories?` + qs({ file, offset, limit, stop: q.stop, text: q.text, correct: q.tcorrect,
    min_reward: q.min_reward, max_reward: q.max_reward, group: q.group }));
  const set = (k, v) => go("run", id, { ...q, file, [k]: v, offset: 0 });
  const box = h("div", { id: "trajectories" },
    h("h2", {}, "Trajectories"),
    h("div", { cls: "filters" },
      files.length > 1 ? h("label", {}, "file ", h("select", { id: "f-file", onchange: e => set("file", e.target.value) },
        files.map(f => h("option", { value: f, selected: f === file }, f)))) : h("span", { cls: "muted" }, file),
      h("label", {}, "stop reason ", h("select", { id: "f-tstop", onchange: e => set("stop", e.target.value) },
        h("option", { value: "" }, "all"), Object.keys(page.stops).sort().map(k => h("option", { value: k, selected: q.stop === k }, `${k} (${page.stops[k]})`)))),
      h("label", {}, "correct ", h("select", { id: "f-tcorrect", onchange: e => set("tcorrect", e.target.value) },
        ["", "yes", "no"].map(v => h("option", { value: v, selected: (q.tcorrect || "") === v }, v || "all")))),
      h("label", {}, "min reward ", h("input", { id: "f-minr", size: 4, value: q.min_reward || "", onchange: e => set("min_reward", e.target.value) })),
      h("input", { id: "f-text", placeholder: "search question / id", value: q.text || "", onchange: e => set("text", e.target.value) }),
      h("span", { id: "traj-count", cls: "muted" }, `${page.matched} of ${page.total} trajectories` +
        (page.indexing ? ` — indexing ${Math.round(100 * page.indexed_bytes / Math.max(1, page.size))}%…` : ""))),
    errorList(page.errors, `${page.error_count} line(s) of ${file} are not trajectories:`),
    table([
      { label: "line", cell: r => h("a", { href: `#traj/${id}?${qs({ file, n: r.n })}` }, r.line) },
      { label: "step", key: "step", num: true },
      { label: "question", cell: r => r.bad ? `unreadable line: ${r.bad}` : short(r.q, 90) },
      { label: "prediction", cell: r => short(r.pred ?? "(none)", 40) },
      { label: "reward", cell: r => h("span", { cls: r.reward > 0 ? "good" : "bad" }, fmt(r.reward, 2)), num: true },
      { label: "stop", key: "stop" }, { label: "turns", key: "turns", num: true }, { label: "tools", key: "tools", num: true },
      { label: "group", cell: r => r.group && r.group !== "eval" ? h("a", { href: `#group/${id}?${qs({ file, group: r.group })}` }, r.group) : "" },
    ], page.rows, r => ({ cls: r.bad ? "badrow" : "", "data-row": "traj" })),
    h("div", { cls: "pager" },
      h("button", { id: "prev", disabled: offset <= 0, onclick: () => go("run", id, { ...q, file, offset: Math.max(0, offset - limit) }) }, "‹ prev"),
      h("span", { cls: "muted" }, `${page.matched ? offset + 1 : 0}–${Math.min(offset + limit, page.matched)} of ${page.matched}`),
      h("button", { id: "next", disabled: offset + limit >= page.matched, onclick: () => go("run", id, { ...q, file, offset: offset + limit }) }, "next ›")));
  if (page.indexing) setTimeout(() => { if (HX.route && HX.route.page === "run") render(true); }, 700);
  return box;
}

HX.pages.run = async ({ id, q }) => {
  const s = await api(`run/${id}`);
  HX.stamp = s.stamp;  // what this render shows: a later change of the run's files re-renders it
  crumbs([s.name, `#run/${id}`]);
  const head = h("div", {}, h("h1", {}, s.name, " ", h("span", { cls: "pill", id: "run-kind" }, s.kind)),
    h("div", { cls: "muted" }, s.path, s.model ? ` — model ${s.model}` : "",
      (s.files || []).flatMap(f => [" · ", h("a", { href: `/api/run/${id}/file/${f}`, target: "_blank", cls: "run-file" }, f)])),
    errorList(s.errors));
  const body = s.kind === "eval" ? evalSection(s, q, id) : s.kind === "datagen" ? datagenSection(s, q, id) : trainSection(s);
  const kindHasTrajectories = s.kind !== "datagen" || s.trajectory_files.length;
  return h("div", {}, head, s.kind === "ask" ? cards(Object.entries(s.results || {}).filter(([, v]) => typeof v !== "object")) : body,
    kindHasTrajectories ? await trajectoryBrowser(s, q, id) : null);
};

HX.pages.item = async ({ id, q }) => {
  const [s, it] = await Promise.all([api(`run/${id}`), api(`run/${id}/item?index=${+q.index || 0}`)]);
  crumbs([s.name, `#run/${id}`], [`item ${it.index}`]);
  return h("div", {}, h("h1", {}, `Item ${it.index}: `, h("span", { cls: it.status === "accepted" ? "good" : "bad" }, it.status)),
    it.reason ? h("p", { cls: "bad" }, "reason: ", it.reason) : null,
    cards([["hops", it.hops], ["seconds", it.seconds]]),
    h("h3", {}, "Question"), h("pre", {}, it.question || ""), h("h3", {}, "Answer"), h("pre", {}, it.answer || ""),
    h("h2", {}, "Edits"),
    table([{ label: "action", key: "action" }, { label: "accepted", cell: e => e.accepted ? "yes" : "no" },
           { label: "question", cell: e => short(e.question, 120) }, { label: "note", cell: e => e.note || "" },
           { label: "checks", cell: e => (e.checks || []).map(c => h("div", { cls: c.passed ? "good" : "bad" },
             `${c.name}: ${c.passed ? "pass" : "fail"}${c.reason ? " — " + c.reason : ""}`)) }], it.edits || []),
    h("h2", {}, "Statements"), table([{ label: "text", key: "text" }, { label: "url", key: "url" }], it.statements || []));
};
