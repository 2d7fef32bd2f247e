"use strict";
// The overview (sweeps, leaderboard, Pareto front, curves) and the sweep view.
const COLUMNS = [
  ["pick", "", "text"], ["run_id", "run", "text"], ["family", "family", "text"], ["params", "params", "num"],
  ["draft_ms_per_token", "draft ms/tok", "num"], ["acceptance_length", "acc. length", "num"],
  ["per_position", "per position", "text"], ["spec_tok_s", "spec tok/s", "num"],
  ["baseline_tok_s", "base tok/s", "num"], ["speedup", "speedup [95% CI]", "num"],
  ["lossless", "lossless", "text"], ["status", "status", "text"], ["note", "note", "text"]];
// Sorting by one of these ranks the runs: runs that count (completed, lossless, measured)
// always come before those that do not, whatever figure the others show.
const RANKING = new Set(["speedup", "acceptance_length", "spec_tok_s", "per_position", "lossless"]);
let sort = {key: "speedup", dir: -1};
const picked = new Set();

function cell(run, key) {
  if (key === "params") return fmtParams(run.params);
  // a zero-width space after each slash lets a long row of rates wrap instead of widening the table
  if (key === "per_position") return run.per_position.length ? run.per_position.map((r) => fmt(r, 2)).join("/\u200b") : "-";
  if (key === "speedup") return fmtSpeedup(run);
  if (key === "lossless") return isNum(run.checked_prompts) && run.checked_prompts > 0
      ? (run.checked_prompts - (run.mismatches || 0)) + "/" + run.checked_prompts : "-";
  if (key === "status") {
    const p = run.progress;
    return statusText(run) + (p && p.step ? " (step " + p.step + (p.max_steps ? "/" + p.max_steps : "") +
                              (isNum(p.eta_s) ? ", ~" + fmtDuration(p.eta_s) + " left" : "") + ")" : "");
  }
  if (key === "note") return run.note || (run.status === "dead" ? run.error : "") || "";
  if (["draft_ms_per_token", "acceptance_length"].includes(key)) return fmt(run[key], 2);
  if (["spec_tok_s", "baseline_tok_s"].includes(key)) return fmt(run[key], 1);
  const v = run[key];
  return v === null || v === undefined ? "-" : v;
}
function sortValue(run, key) {
  if (key === "per_position") return run.per_position[0];
  if (key === "lossless") return run.checked_prompts ? 1 - (run.mismatches || 0) / run.checked_prompts : null;
  return run[key];
}
function sortedRuns(runs) {
  return [...runs].sort((a, b) => {
    if (RANKING.has(sort.key) && !!a.counts !== !!b.counts) return a.counts ? -1 : 1;
    const x = sortValue(a, sort.key), y = sortValue(b, sort.key);
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;   // unmeasured last, either direction
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * sort.dir;
  });
}

function drawLeaderboard(runs) {
  const head = document.querySelector("#leaderboard thead tr");
  head.replaceChildren(...COLUMNS.map(([key, label, kind]) => {
    if (key === "pick") return el("th", "compare", {"class": "text"});
    const th = el("th", label + (sort.key === key ? (sort.dir < 0 ? " ▼" : " ▲") : ""), {"class": kind, "data-key": key});
    th.addEventListener("click", () => { sort = {key, dir: sort.key === key ? -sort.dir : -1}; drawLeaderboard(runs); });
    return th;
  }));
  document.querySelector("#leaderboard tbody").replaceChildren(...sortedRuns(runs).map((run) => {
    const mark = run.note === "baseline" ? " baseline" : (run.note || "").startsWith("below baseline") ? " below" : "";
    const tr = el("tr", null, {"class": statusText(run) === "failed" ? "failed" : run.status + mark,
                                title: run.error || "", "data-run": run.run_dir});
    for (const [key, , kind] of COLUMNS) {
      const td = el("td", null, {"class": kind + ({note: " note", per_position: " rates", run_id: " run"}[key] || "")});
      if (key === "pick") {
        const box = el("input", null, {type: "checkbox", "class": "pick"});
        box.checked = picked.has(run.run_dir);
        box.addEventListener("change", () => { box.checked ? picked.add(run.run_dir) : picked.delete(run.run_dir); updateCompare(); });
        td.appendChild(box);
      } else if (key === "run_id") {
        td.appendChild(runLink(run));
      } else {
        td.textContent = String(cell(run, key));
        if (key === "speedup" && run.tied) td.appendChild(el("span", "tied", {"class": "tied", title: "tied with the leader"}));
      }
      tr.appendChild(td);
    }
    return tr;
  }));
}
function updateCompare() {
  const button = document.getElementById("compare-button");
  button.disabled = picked.size < 2;
  button.textContent = "compare " + picked.size + " selected";
}

function drawSweeps(sweeps) {
  const root = document.getElementById("sweeps");
  if (!sweeps.length) { root.replaceChildren(el("p", "no sweep under this directory")); return; }
  const table = el("table", null, {id: "sweep-table"});
  const head = el("tr"); ["sweep", "jobs", "done", "failed", "training", "queued", "skipped (done before)", "time left (est.)"]
      .forEach((h, i) => head.appendChild(el("th", h, {"class": i ? "num" : "text"})));
  table.appendChild(head);
  const parts = [el("div", null, {"class": "scroll"})];
  parts[0].appendChild(table);
  for (const s of sweeps) {
    const tr = el("tr");
    [s.sweep_dir, s.jobs, s.completed, s.failed, s.running, s.queued === null ? "?" : s.queued, s.resumed, s.eta_s === 0 ? "none" : fmtDuration(s.eta_s)]
        .forEach((v, i) => tr.appendChild(el("td", v, {"class": i ? "num" : "text"})));
    table.appendChild(tr);
    if (s.halving) parts.push(drawHalving(s));
    if (s.halving_error) parts.push(el("p", s.halving_error, {"class": "error"}));
  }
  root.replaceChildren(...parts);
}
function drawHalving(s) {
  const h = s.halving, box = el("div", null, {"class": "halving scroll"});
  box.appendChild(el("h3", "successive halving of " + s.sweep_dir + " by " + h.metric + " (eta " + h.eta + ")"));
  const table = el("table");
  const head = el("tr"); ["rung", h.budget_key, "candidate", h.metric, "decision"].forEach((x) => head.appendChild(el("th", x)));
  table.appendChild(head);
  for (const rung of h.rungs) for (const run of rung.runs) {
    const tr = el("tr");
    [rung.rung, rung.budget, run.overrides.join(" ") || "(defaults)", fmt(run.value, 3),
     run.promoted ? "promoted" : (h.winner && run.run_dir === h.winner.run_dir ? "winner" : "stopped")]
        .forEach((v, i) => tr.appendChild(el("td", v, {"class": i === 2 || i === 4 ? "text" : "num"})));
    table.appendChild(tr);
  }
  box.appendChild(table);
  return box;
}
function drawFailures(runs) {
  const failed = runs.filter((r) => statusText(r) === "failed");
  const root = document.getElementById("failures");
  root.replaceChildren(...failed.map((r) => {
    const p = el("p", null, {"class": "failure"});
    p.append(runLink(r), el("span", ": " + (r.error || r.note || "failed"), {"class": "error"}));
    return p;
  }));
}

// Pareto front: speedup against draft cost. ms per drafted token covers every measured run,
// the training-free ones included; parameters (log axis) leave those out, so they are drawn
// as dashed reference lines instead.
function drawPareto(state) {
  const cost = document.getElementById("cost").value;
  const div = chartBox(document.getElementById("overview-charts"), "pareto", "Pareto front: speedup vs draft cost");
  const runs = state.runs, frontDirs = new Set(state.sweep_view.pareto[cost]);
  const pts = runs.filter((r) => r.counts && isNum(r[cost]) && r[cost] > 0 && isNum(r.speedup));
  const front = state.sweep_view.pareto[cost].map((d) => runs.find((r) => r.run_dir === d)).filter(Boolean);
  const traces = [];
  const families = [...new Set(pts.map((r) => r.family))];
  families.forEach((fam, i) => {
    const rs = pts.filter((r) => r.family === fam);
    traces.push({type: "scatter", mode: "markers", name: plotText(fam || "?"), x: rs.map((r) => r[cost]), y: rs.map((r) => r.speedup),
                 marker: {size: rs.map((r) => frontDirs.has(r.run_dir) ? 11 : 7), color: COLORS[i % COLORS.length]},
                 error_y: {type: "data", symmetric: false, array: rs.map((r) => r.speedup_ci ? r.speedup_ci[1] - r.speedup : 0),
                           arrayminus: rs.map((r) => r.speedup_ci ? r.speedup - r.speedup_ci[0] : 0), thickness: 1, width: 3},
                 text: rs.map((r) => plotText(r.label || r.run_id)), customdata: rs.map((r) => r.run_dir),
                 hovertemplate: "%{text}<br>%{y:.2f}x at %{x:.3g}<extra></extra>", meta: "point"});
  });
  traces.push({type: "scatter", mode: "lines", name: "Pareto front", x: front.map((r) => r[cost]), y: front.map((r) => r.speedup),
               line: {color: "#d62728", dash: "dash", shape: "hv"}, hoverinfo: "skip", meta: "front"});
  if (cost === "params") {
    runs.filter((r) => r.counts && r.params === 0 && isNum(r.speedup)).forEach((r, i) => {
      traces.push({type: "scatter", mode: "lines", name: plotText(shorten(r.label || r.run_id, 20) + " (0 params)"), x: [Math.min(...pts.map((p) => p.params), 1e3), Math.max(...pts.map((p) => p.params), 1e6)],
                   y: [r.speedup, r.speedup], line: {dash: "dot", color: "#888"}, hovertemplate: plotText(r.label || r.run_id) + ": %{y:.2f}x<extra></extra>"});
    });
  }
  return plot(div, traces, baseLayout(cost === "params" ? "draft parameters" : "draft ms per drafted token", "speedup (x)",
    {xaxis: {title: {text: cost === "params" ? "draft parameters" : "draft ms per drafted token"}, type: "log", automargin: true}}));
}
// One line per recipe x family: mean acceptance length against training tokens (log x);
// the baselines are dashed lines with their own legend entries.
function drawScaling(scaling) {
  const div = chartBox(document.getElementById("overview-charts"), "scaling", "Acceptance vs training tokens (data scaling)");
  const pts = (scaling.points || []).filter((p) => isNum(p.tokens) && p.tokens > 0 && isNum(p.acceptance_length));
  const series = new Map();
  for (const p of pts) {
    const key = p.recipe + " · " + p.family;
    if (!series.has(key)) series.set(key, []);
    series.get(key).push(p);
  }
  // each run a marker; the line joins the median at each budget (sizes and seeds share a budget)
  const traces = [...series.entries()].flatMap(([key, ps], i) => {
    ps.sort((a, b) => a.tokens - b.tokens);
    const budgets = [...new Set(ps.map((p) => p.tokens))];
    const median = (t) => { const v = ps.filter((p) => p.tokens === t).map((p) => p.acceptance_length).sort((a, b) => a - b);
                            return (v[(v.length - 1) >> 1] + v[v.length >> 1]) / 2; };
    return [line(key, budgets, budgets.map(median), i, {mode: "lines", legendgroup: key, hovertemplate: plotText(key) + " median<br>%{x:.3s} tokens: %{y:.2f}<extra></extra>"}),
            line(key, ps.map((p) => p.tokens), ps.map((p) => p.acceptance_length), i,
                 {mode: "markers", legendgroup: key, showlegend: false, text: ps.map((p) => plotText(p.run + ": " + fmt(p.speedup, 2) + "x")),
                  hovertemplate: "%{text}<br>%{x:.3s} tokens: %{y:.2f}<extra></extra>", meta: "point"})];
  });
  const xs = pts.map((p) => p.tokens);
  // a baseline per family: a dashed line, or a band from its lowest to its highest score
  // where several sweeps scored it (as plot_scaling draws them)
  const byFamily = new Map();
  for (const b of (scaling.baselines || []).filter((b) => isNum(b.acceptance_length))) {
    if (!byFamily.has(b.family)) byFamily.set(b.family, []);
    byFamily.get(b.family).push(b.acceptance_length);
  }
  const x0 = Math.min(...xs, 1e3), x1 = Math.max(...xs, 1e5);
  [...byFamily.entries()].forEach(([family, values], i) => {
    const lo = Math.min(...values), hi = Math.max(...values), color = ["#888", "#444", "#bbb"][i % 3];
    const name = plotText(family + " (baseline" + (values.length > 1 ? ", " + values.length + " scores" : "") + ")");
    traces.push(lo === hi
      ? {type: "scatter", mode: "lines", name, x: [x0, x1], y: [lo, lo], line: {dash: "dash", color},
         hovertemplate: plotText(family) + ": %{y:.2f}<extra></extra>", meta: "baseline"}
      : {type: "scatter", mode: "lines", name, x: [x0, x1, x1, x0, x0], y: [lo, lo, hi, hi, lo], fill: "toself",
         line: {dash: "dash", color, width: 1}, opacity: 0.4, hovertemplate: plotText(family) + ": %{y:.2f}<extra></extra>", meta: "baseline"});
  });
  return plot(div, pts.length ? traces : [], baseLayout("training tokens", "mean acceptance length",
    {xaxis: {title: {text: "training tokens"}, type: "log", automargin: true}}));
}
function drawOverviewCharts(state) {
  const parent = document.getElementById("overview-charts");
  drawPareto(state);
  plot(chartBox(parent, "acceptance", "Acceptance per draft position"), acceptanceTraces(state.runs), acceptanceLayout());
  drawScaling(state.scaling || {});
  const lossDiv = chartBox(parent, "loss", "Training loss (smoothed; ▲ spike, ◆ rollback, ○ restart)");
  const weight = smoothingControl(document.getElementById("loss-box"), "loss-smoothing", () => drawOverviewCharts(state));
  plot(lossDiv, lossTraces(state.runs, weight), lossLayout());
}

// An axis is named by its key's last part (two parts where the last repeats), kept short
// enough that neighbouring labels never meet; the table under the chart gives full keys.
function axisLabels(knobs) {
  const last = knobs.map((k) => k.split(".").slice(-1)[0]);
  return knobs.map((k, i) => shorten(last.filter((x) => x === last[i]).length > 1 ? k.split(".").slice(-2).join(".") : last[i], 14));
}

// Sweep view: parallel coordinates of the knobs that vary against the metrics; importance.
function drawSweepView(state) {
  const view = state.sweep_view, parent = document.getElementById("sweep-charts");
  const metric = document.getElementById("metric").value;
  const values = view.metrics[metric];
  const labels = axisLabels(view.axes.map((a) => a.knob));
  const dims = view.axes.map((a, n) => {
    const dim = {label: plotText(labels[n]), values: a.values};
    if (a.ticks) Object.assign(dim, {tickvals: a.ticks.map((_, i) => i), ticktext: a.ticks.map((t) => plotText(shorten(t, 12))),
                                     range: [-0.5, a.ticks.length - 0.5]});
    else if (a.log) dim.label = dim.label + " (log10)";
    return dim;
  });
  for (const m of ["acceptance_length", "speedup"]) dims.push({label: m === "speedup" ? "speedup" : "acc. length", values: view.metrics[m]});
  const pc = chartBox(parent, "parcoords", "Knobs against results (parallel coordinates, coloured by " + metric + ")", true);
  const ok = view.run_dirs.length >= 2 && view.axes.length;
  pc.dataset.axes = ok ? dims.length : 0;
  Plotly.react(pc, ok ? [{type: "parcoords", dimensions: dims, labelfont: {size: 11}, tickfont: {size: 10},
                          line: {color: values, colorscale: "Viridis", showscale: true, colorbar: {title: {text: metric === "speedup" ? "speedup" : "acc. length"}}}}]
                      : [], {margin: {l: 60, r: 60, t: 50, b: 30}, annotations: ok ? [] : [{text: "fewer than two counted runs, or no knob varies", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5}]}, PLOT_CONFIG);
  const keys = document.getElementById("axis-keys");
  keys.replaceChildren(kvTable(view.axes.map((a, n) => [labels[n], a.knob + (a.aliases.length ? " (these vary with it: " + a.aliases.join(", ") + ")" : "")])));
  if (view.hidden_knobs.length) keys.appendChild(el("p", "also varying (not drawn): " + view.hidden_knobs.join(", ")));
  const imp = view.importance[metric];
  const bar = chartBox(parent, "importance", "Knob importance for " + metric + " (eta², sums to 1)");
  plot(bar, imp.length ? [{type: "bar", orientation: "h", name: "importance for " + metric, y: imp.map((e) => plotText(shorten(e.knob, 40))).reverse(),
                           x: imp.map((e) => e.score).reverse(), marker: {color: COLORS[0]},
                           hovertemplate: "%{y}: %{x:.2f}<extra></extra>"}] : [],
       baseLayout("share of the metric's variance explained", "", {margin: {l: 10, r: 10, t: 10, b: 50},
                  yaxis: {automargin: true}}));
}
