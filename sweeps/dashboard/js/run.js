"use strict";
// One run's page and the comparison of several runs.

function runSummary(d) {
  const s = d.summary || {};
  return [["status", statusText(d)], ["error", d.error], ["family", (d.speculator || {}).family],
          ["params", (d.speculator || {}).params], ["speedup [95% CI]", fmtSpeedup(s)],
          ["acceptance length", s.acceptance_length], ["acceptance rate", s.acceptance_rate], ["k", s.k],
          ["spec tok/s", s.spec_tok_s], ["base tok/s", s.baseline_tok_s], ["draft ms/token", s.draft_ms_per_token],
          ["chosen method", (d.method || {}).chosen], ["wall s", s.wall_s]];
}
function pathsBlock(paths) {
  const box = el("div", null, {"class": "paths"});
  const row = (label, path) => {
    const p = el("p", label + ": ");
    p.appendChild(el("code", path, {"class": "path"}));
    box.appendChild(p);
  };
  row("run directory", paths.run_dir);
  if (paths.checkpoint) row("checkpoint", paths.checkpoint);
  for (const e of paths.exports || []) row("export", e);
  if (!(paths.exports || []).length) box.appendChild(el("p", "export: none under this runs directory"));
  return box;
}
function flatPairs(obj, prefix) {
  const out = [];
  for (const [k, v] of Object.entries(obj || {})) {
    if (v && typeof v === "object" && !Array.isArray(v)) out.push(...flatPairs(v, prefix + k + "."));
    else out.push([prefix + k, Array.isArray(v) ? JSON.stringify(v) : v]);
  }
  return out;
}
function section(parent, title, node) {
  const box = el("div", null, {"class": "chart"});
  box.append(el("h3", title), node);
  parent.appendChild(box);
}

function drawRunPage(d) {
  const root = document.getElementById("run-view");
  const keep = document.getElementById("run-charts");
  const sameRun = root.dataset.run === d.run_dir;
  if (!sameRun) root.replaceChildren();
  root.dataset.run = d.run_dir;
  root.dataset.status = d.status;
  const head = el("div", null, {id: "run-head"});
  head.append(el("h2", d.run_id), el("p", null));
  if (d.progress) head.appendChild(el("p", "training: step " + d.progress.step + (d.progress.max_steps ? " of " + d.progress.max_steps : "") +
                                      ", ~" + fmtDuration(d.progress.eta_s) + " left (estimate)", {id: "run-progress"}));
  const tables = el("div", null, {"class": "tables", id: "run-tables"});
  section(tables, "Summary", kvTable(runSummary(d)));
  if (d.paths) section(tables, "Checkpoint and exports", pathsBlock(d.paths));
  const charts = sameRun && keep ? keep : el("div", null, {"class": "charts", id: "run-charts"});
  const old = document.getElementById("run-head");
  if (old) old.replaceWith(head); else root.appendChild(head);
  const oldTables = document.getElementById("run-tables");
  if (oldTables) oldTables.replaceWith(tables); else root.appendChild(tables);
  if (!charts.parentNode) root.appendChild(charts);
  drawRunCharts(charts, [d]);
  const more = el("div", null, {"class": "tables", id: "run-records"});
  if (d.data && Object.keys(d.data).length) section(more, "Data and cache", kvTable(Object.entries(d.data)));
  if (d.lossless && Object.keys(d.lossless).length) section(more, "Lossless record", kvTable(Object.entries(d.lossless)));
  if (d.train && Object.keys(d.train).length) section(more, "Training", kvTable(Object.entries(d.train)));
  const config = el("details", null, {id: "run-config"});
  config.append(el("summary", "resolved config"), kvTable(flatPairs(d.config, "")));
  section(more, "Resolved config", config);
  const oldMore = document.getElementById("run-records");
  if (oldMore) { const open = oldMore.querySelector("details") && oldMore.querySelector("details").open; oldMore.replaceWith(more); config.open = !!open; }
  else root.appendChild(more);
}

// The figures of one or more runs (one trace per run on each chart).
function drawRunCharts(parent, ds) {
  const many = ds.length > 1, name = (d) => d.label || d.run_id;
  plot(chartBox(parent, "run-acceptance", "Acceptance per draft position"),
       ds.filter((d) => (d.per_position || []).length).map((d, i) => ({type: "bar", name: plotText(shorten(name(d), 28)),
         x: d.per_position.map((_, p) => p + 1), y: d.per_position, marker: {color: COLORS[i % COLORS.length]},
         hovertemplate: plotText(name(d)) + "<br>position %{x}: %{y:.3f}<extra></extra>"})),
       acceptanceLayout());
  plot(chartBox(parent, "run-prompts", "Speedup per prompt"),
       ds.filter((d) => (d.per_prompt || []).length).map((d, i) => ({type: "bar", name: plotText(shorten(name(d), 28)),
         x: d.per_prompt.map((p) => p.prompt), y: d.per_prompt.map((p) => p.speedup), marker: {color: COLORS[i % COLORS.length]},
         customdata: d.per_prompt.map((p) => fmt(p.acceptance_length, 2) + (p.category ? ", " + plotText(p.category) : "")),
         hovertemplate: plotText(name(d)) + "<br>prompt %{x}: %{y:.2f}x, acceptance length %{customdata}<extra></extra>"})),
       baseLayout("prompt", "speedup (x)", {barmode: "group", xaxis: {title: {text: "prompt"}, dtick: 1, automargin: true}}));
  if (ds.some((d) => (d.per_category || []).length)) {
    plot(chartBox(parent, "run-categories", "Speedup per prompt category"),
         ds.filter((d) => (d.per_category || []).length).map((d, i) => ({type: "bar", name: plotText(shorten(name(d), 28)),
           x: d.per_category.map((c) => plotText(shorten(c.category, 20))), y: d.per_category.map((c) => c.speedup),
           marker: {color: COLORS[i % COLORS.length]}, text: d.per_category.map((c) => c.prompts + " prompts"),
           hovertemplate: "%{x}: %{y:.2f}x (%{text})<extra></extra>"})),
         baseLayout("category", "mean speedup (x)", {barmode: "group"}));
  }
  const withCurve = ds.filter((d) => d.method && d.method.verify_cost_ms.length);
  plot(chartBox(parent, "run-verify", "Verification cost curve the method was chosen from"),
       withCurve.map((d, i) => line(name(d) + (many ? "" : " (" + (d.method.source || "measured") + ")"),
         d.method.verify_cost_ms.map((p) => p[0]), d.method.verify_cost_ms.map((p) => p[1]), i)),
       baseLayout("tokens verified at once", "ms per verification",
                  {xaxis: {title: {text: "tokens verified at once"}, type: "log", dtick: Math.log10(2), automargin: true}}));
  const withCands = ds.filter((d) => d.method && d.method.candidates.length);
  plot(chartBox(parent, "run-methods", "Drafting methods tried (pilot tok/s; chosen outlined)"),
       withCands.map((d, i) => ({type: "bar", orientation: "h", name: plotText(shorten(name(d), 28)),
         y: d.method.candidates.map((c) => plotText(c.label)), x: d.method.candidates.map((c) => c.tok_s),
         marker: {color: COLORS[i % COLORS.length],
                  line: {color: "#000", width: d.method.candidates.map((c) => c.label === d.method.chosen ? 3 : 0)}},
         customdata: d.method.candidates.map((c) => fmt(c.acceptance_length, 2)),
         hovertemplate: "%{y}: %{x:.1f} tok/s, acceptance length %{customdata}<extra></extra>"})),
       baseLayout("tok/s (pilot)", "", {barmode: "group", yaxis: {automargin: true}}));
  const lossDiv = chartBox(parent, "run-loss", "Training loss (smoothed; ▲ spike, ◆ rollback, ○ restart)");
  const weight = smoothingControl(parent.querySelector("#run-loss-box"), "run-loss-smoothing", () => drawRunCharts(parent, ds));
  plot(lossDiv, lossTraces(ds, weight), lossLayout());
}

// Compare: the config keys whose values differ, the summaries side by side, shared charts.
function drawCompare(ds) {
  const root = document.getElementById("compare-view");
  root.replaceChildren(el("h2", "Comparing " + ds.length + " runs"));
  // where run ids repeat (one sweep run into two runs directories) the directories name them
  ds.forEach((d) => { d.label = ds.filter((x) => x.run_id === d.run_id).length > 1 ? d.run_dir : d.run_id; });
  const flat = ds.map((d) => new Map(flatPairs(d.config, "")));
  const keys = [...new Set(flat.flatMap((m) => [...m.keys()]))].sort()
      .filter((k) => new Set(flat.map((m) => JSON.stringify(m.get(k)))).size > 1);
  const table = el("table", null, {id: "compare-config"});
  const head = el("tr");
  head.appendChild(el("th", "", {"class": "text"}));
  ds.forEach((d) => { const th = el("th", null, {"class": "text"}); th.appendChild(runLink(d)); head.appendChild(th); });
  table.appendChild(head);
  const addRow = (label, values, cls) => {
    const tr = el("tr", null, {"class": cls || ""});
    tr.appendChild(el("th", label, {"class": "text"}));
    values.forEach((v) => tr.appendChild(el("td", fmtValue(v), {"class": isNum(v) ? "num" : "text"})));
    table.appendChild(tr);
  };
  runSummary(ds[0]).forEach(([label], i) => addRow(label, ds.map((d) => runSummary(d)[i][1]), "summary"));
  if (!keys.length) addRow("config", ds.map(() => "identical"));
  keys.forEach((k) => addRow(k, flat.map((m) => m.has(k) ? m.get(k) : "(absent)"), "diff"));
  const wrap = el("div", null, {"class": "scroll"});
  wrap.appendChild(table);
  root.append(el("h3", "Results and the config keys that differ"), wrap);
  const charts = el("div", null, {"class": "charts", id: "compare-charts"});
  root.appendChild(charts);
  drawRunCharts(charts, ds);
}
