"use strict";
// Routing (#overview, #sweep, #run=DIR, #compare=DIR|DIR...) and the live refresh: the
// state is polled every few seconds and the shown view redrawn in place (Plotly.react).
const POLL_MS = 3000;
let latest = null;
let drawnKey = null;  // the state last drawn, less its timestamp: an unchanged state is not redrawn

function route() {
  const hash = decodeURIComponent(location.hash.slice(1));
  if (hash.startsWith("run=")) return {view: "run", dirs: [hash.slice(4)]};
  if (hash.startsWith("compare=")) return {view: "compare", dirs: hash.slice(8).split("|").filter(Boolean)};
  if (hash === "sweep") return {view: "sweep"};
  return {view: "overview"};
}
function show(view) {
  for (const name of ["overview", "sweep", "run", "compare"]) {
    document.getElementById(name + "-view").classList.toggle("hidden", name !== view);
    const tab = document.getElementById("tab-" + name);
    if (tab) tab.classList.toggle("active", name === view);
  }
  if (view !== "run") {
    const run = document.getElementById("run-view");
    run.replaceChildren(); delete run.dataset.run; delete run.dataset.status;
  }
  if (view !== "compare") document.getElementById("compare-view").replaceChildren();
}
async function drawView(fresh) {
  const r = route();
  show(r.view);
  if (r.view === "overview" && latest) {
    drawFailures(latest.runs); drawSweeps(latest.sweeps); drawLeaderboard(latest.runs); drawOverviewCharts(latest);
  } else if (r.view === "sweep" && latest) {
    drawSweepView(latest);
  } else if (r.view === "run") {
    const summary = latest && latest.runs.find((x) => x.run_dir === r.dirs[0]);
    // a finished run does not change: fetched once; one in progress is refetched each poll,
    // and once more when its status changes (it finished or failed)
    const shown = document.getElementById("run-view").dataset;
    if (fresh || !summary || summary.status === "running" || shown.run !== r.dirs[0] || shown.status !== summary.status)
      drawRunPage(await getJSON("api/run?dir=" + encodeURIComponent(r.dirs[0])));
  } else if (r.view === "compare" && fresh) {
    drawCompare(await Promise.all(r.dirs.map((d) => getJSON("api/run?dir=" + encodeURIComponent(d)))));
  }
  document.body.dataset.drawn = r.view;  // what the browser test waits for
}
async function refresh() {
  const status = document.getElementById("status");
  try {
    latest = await getJSON("api/state");
    const key = location.hash + JSON.stringify(Object.assign({}, latest, {generated_at: 0}));
    if (key !== drawnKey) { await drawView(false); drawnKey = key; }
    status.className = "";
    const training = latest.runs.filter((x) => x.status === "running").length;
    status.textContent = latest.runs.length + " runs under " + latest.root + (training ? " (" + training + " training)" : "") +
                         " — updated " + new Date().toLocaleTimeString();
  } catch (err) {
    status.className = "error";
    status.textContent = "could not load the runs: " + err.message;
  }
}
window.addEventListener("hashchange", () => drawView(true).catch((err) => {
  const status = document.getElementById("status");
  status.className = "error"; status.textContent = "could not load: " + err.message;
}));
document.getElementById("cost").addEventListener("change", () => latest && drawPareto(latest));
document.getElementById("metric").addEventListener("change", () => latest && drawSweepView(latest));
document.getElementById("compare-button").addEventListener("click", () => {
  location.hash = "compare=" + encodeURIComponent([...picked].join("|"));
});
refresh().then(() => drawView(true));
setInterval(refresh, POLL_MS);  // live while a sweep runs
