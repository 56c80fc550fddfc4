// Overview: token and cost charts, totals, models, active conversations, tools, compressions and errors, live.
import { applyFragments, fetchFragments, flash, liveSocket, pageScript, readJSON, serialised } from "./live.js";
import { costChart, tokensChart, updateCostChart, updateTokensChart } from "./charts.js";

const url = pageScript(import.meta.url).dataset.fragments;
const chartData = readJSON("tokens-chart-data");
const chart = tokensChart(document.getElementById("tokens-chart"), chartData);
const costs = costChart(document.getElementById("cost-chart"), chartData);
let changedTools = false;

const refresh = serialised(async () => {
  const json = await fetchFragments(url + location.search);
  const toolsChanged = changedTools;
  changedTools = false;
  applyFragments(json.fragments);
  updateTokensChart(chart, json.data.tokens_chart);
  updateCostChart(costs, json.data.tokens_chart);
  if (toolsChanged) flash(document.querySelectorAll("#overview-tools tbody tr"));
});

liveSocket("/ws/live/", {
  onOpen: () => refresh(),
  onChanges: (changes) => {
    changedTools ||= changes.tool_calls > 0;
    refresh();
  },
});
