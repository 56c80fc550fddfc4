// Tools: statistics, latency histogram and errors by type, live; the tool picker submits itself.
import { applyFragments, fetchFragments, liveSocket, pageScript, readJSON, serialised } from "./live.js";
import { histogramChart, updateHistogram } from "./charts.js";

const url = pageScript(import.meta.url).dataset.fragments;
const chart = histogramChart(document.getElementById("latency-chart"), readJSON("latency-chart-data"));

for (const select of document.querySelectorAll("select[data-autosubmit]")) {
  select.addEventListener("change", () => select.form.submit());
}

const refresh = serialised(async () => {
  const json = await fetchFragments(url + location.search);
  applyFragments(json.fragments);
  updateHistogram(chart, json.data.histogram);
});

liveSocket("/ws/live/", {
  onOpen: () => refresh(),
  onChanges: (changes) => changes.tool_calls > 0 && refresh(),
});
