"use strict";
// Plotly charts. Each chart keeps a legend (showlegend: true even for one trace), hover
// values, and labels Plotly lays out itself (legend entries, not text on the plot, so
// labels cannot print over each other). Record strings pass through plotText.
// no mode bar: it would sit over the legend; drag zooms, a double click resets
const PLOT_CONFIG = {displaylogo: false, responsive: false, displayModeBar: false};

function baseLayout(xtitle, ytitle, extra) {
  return Object.assign({
    margin: {l: 60, r: 10, t: 10, b: 50}, showlegend: true,
    // a vertical legend right of the plot: Plotly scrolls it when runs are many, and it never
    // meets the axis titles or tick labels
    legend: {font: {size: 10}},
    xaxis: {title: {text: xtitle}, automargin: true}, yaxis: {title: {text: ytitle}, automargin: true},
    hovermode: "closest", font: {size: 11},
  }, extra || {});
}
// The chart's div inside a titled box; `plot` is re-used across refreshes (Plotly.react).
function chartBox(parent, id, title, wide) {
  let box = parent.querySelector("#" + id + "-box");
  if (!box) {
    box = el("div", null, {"class": "chart", id: id + "-box"});
    box.append(el("h3", title), el("div", null, {"class": "plot" + (wide ? " wide" : ""), id: id}));
    parent.appendChild(box);
  }
  box.querySelector("h3").textContent = title;
  return box.querySelector("#" + id);
}
function plot(div, traces, layout) {
  if (!traces.length) {
    traces = [{x: [], y: [], name: "nothing measured yet", type: "scatter"}];
  }
  div.dataset.traces = traces.length;
  return Plotly.react(div, traces, layout, PLOT_CONFIG);
}
function line(name, xs, ys, i, extra) {
  return Object.assign({type: "scatter", mode: "lines+markers", name: plotText(shorten(name, 28)), x: xs, y: ys,
                        line: {color: COLORS[i % COLORS.length], width: 1.5}, marker: {size: 5},
                        hovertemplate: plotText(name) + "<br>%{x}: %{y:.3f}<extra></extra>"}, extra || {});
}

// TensorBoard's smoothing: an exponential moving average, debiased at the start.
function smooth(values, weight) {
  let last = 0, n = 0;
  return values.map((v) => { last = last * weight + (1 - weight) * v; n++; return last / (1 - Math.pow(weight, n)); });
}
const EVENT_SYMBOL = {spike: "triangle-up", rollback: "diamond", restart: "circle-open"};

// Loss curves: the raw curve faint, the smoothed one solid, event markers on the curve.
function lossTraces(runs, weight) {
  const traces = [];
  const seen = new Set();
  runs.filter((r) => r.loss && r.loss.length).forEach((r, i) => {
    const xs = r.loss.map((p) => p[0]), ys = r.loss.map((p) => p[1]), color = COLORS[i % COLORS.length];
    const label = r.label || r.run_id, name = plotText(shorten(label, 28));
    traces.push({type: "scatter", mode: "lines", x: xs, y: ys, name: name + " (raw)", legendgroup: r.run_dir,
                 showlegend: false, opacity: 0.3, line: {color, width: 1}, hoverinfo: "skip"});
    traces.push({type: "scatter", mode: "lines", x: xs, y: smooth(ys, weight), name, legendgroup: r.run_dir, meta: "curve",
                 line: {color, width: 2}, hovertemplate: plotText(label) + "<br>step %{x}: %{y:.4f}<extra></extra>"});
    for (const kind of Object.keys(EVENT_SYMBOL)) {
      const evs = (r.events || []).filter((e) => e.kind === kind);
      if (!evs.length) continue;
      const near = (step) => r.loss.reduce((a, p) => Math.abs(p[0] - step) < Math.abs(a[0] - step) ? p : a, r.loss[0])[1];
      traces.push({type: "scatter", mode: "markers", name: kind, legendgroup: "event-" + kind,
                   showlegend: !seen.has(kind), x: evs.map((e) => e.step), y: evs.map((e) => near(e.step)),
                   marker: {symbol: EVENT_SYMBOL[kind], size: 11, color, line: {color: "#000", width: 1}},
                   text: evs.map((e) => plotText(kind + " at step " + e.step + (e.reason ? ": " + e.reason : ""))),
                   hovertemplate: "%{text}<extra></extra>", meta: "event"});
      seen.add(kind);
    }
  });
  return traces;
}
function lossLayout() {
  return baseLayout("step", "training loss");
}
function smoothingControl(parent, id, onChange) {
  let input = parent.querySelector("#" + id);
  if (!input) {
    const label = el("label", "smoothing ", {"class": "controls"});
    input = el("input", null, {type: "range", min: "0", max: "0.99", step: "0.01", value: "0.6", id});
    const shown = el("span", "0.60");
    input.addEventListener("input", () => { shown.textContent = Number(input.value).toFixed(2); onChange(); });
    label.append(input, shown);
    parent.appendChild(label);
  }
  return Number(input.value);
}
function acceptanceTraces(runs) {
  return runs.filter((r) => (r.per_position || []).some(isNum)).map((r, i) =>
    line(r.label || r.run_id, r.per_position.map((_, p) => p + 1), r.per_position, i));
}
function acceptanceLayout() {
  return baseLayout("draft position", "acceptance rate", {yaxis: {title: {text: "acceptance rate"}, range: [0, 1]},
                                                          xaxis: {title: {text: "draft position"}, dtick: 1}});
}
