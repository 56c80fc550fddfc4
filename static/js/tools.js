// Tools: statistics, context cost, latency histogram and errors by type, live; the tool picker submits itself.
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

// What results cost the context moves with every LLM call that carries one, and with the counts
// filled in after an ingest response (a message naming rounds but no new spans).
const touchesTools = (changes) => changes.tool_calls > 0 || changes.llm_calls > 0 || changes.overflow
  || (changes.spans === 0 && changes.round_ids.length > 0);

liveSocket("/ws/live/", {
  onOpen: () => refresh(),
  onChanges: (changes) => touchesTools(changes) && refresh(),
});
