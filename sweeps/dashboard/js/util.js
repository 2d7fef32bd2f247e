"use strict";
// Shared helpers. Every string from a run (names, errors, configs) reaches the page through
// textContent / setAttribute (el) or, for charts, through plotText: Plotly reads a few HTML
// tags in its labels, so record strings are entity-escaped before Plotly sees them.
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const STATUS = {completed: "done", running: "training", dead: "failed", failed: "failed",
                malformed: "failed", unreadable: "failed", queued: "queued"};

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}
function plotText(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}
function shorten(s, n) { s = String(s); return s.length > n ? s.slice(0, n - 1) + "…" : s; }
const isNum = (v) => typeof v === "number" && isFinite(v);
function fmt(v, digits) { return isNum(v) ? v.toFixed(digits) : "-"; }
function fmtParams(n) {
  if (!isNum(n) || n <= 0) return "-";
  for (const [s, u] of [[1e9, "B"], [1e6, "M"], [1e3, "K"]]) if (n >= s) return (n / s).toPrecision(3) + u;
  return String(n);
}
function fmtValue(v) {
  if (v === null || v === undefined) return "-";
  if (isNum(v)) return Number.isInteger(v) ? String(v) : v.toPrecision(4);
  return String(v);
}
function fmtDuration(s) {
  if (!isNum(s)) return "-";
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function fmtSpeedup(run) {
  if (!isNum(run.speedup)) return "-";
  const ci = run.speedup_ci;
  return run.speedup.toFixed(2) + "x" + (ci ? " [" + ci[0].toFixed(2) + ", " + ci[1].toFixed(2) + "]" : "");
}
function statusText(run) {
  return STATUS[run.status] || String(run.status);
}
// A table of [label, value] pairs (strings as text).
function kvTable(pairs, cls) {
  const table = el("table", null, {"class": "kv " + (cls || "")});
  for (const [k, v] of pairs) {
    const tr = el("tr");
    tr.append(el("th", k, {"class": "text"}), el("td", fmtValue(v), {"class": isNum(v) ? "num" : "text"}));
    table.appendChild(tr);
  }
  return table;
}
function runHash(dir) { return "#run=" + encodeURIComponent(dir); }
function runLink(run) {
  const a = el("a", run.label || run.run_id, {href: runHash(run.run_dir), "class": "run-link"});
  return a;
}
async function getJSON(url) {
  const response = await fetch(url, {cache: "no-store"});
  if (!response.ok) throw new Error("HTTP " + response.status);
  return response.json();
}
