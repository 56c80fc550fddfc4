// One conversation: new and changed turns, the header and the context chart, live.
import { applyFragments, fetchFragments, flash, liveSocket, pageScript, readJSON, serialised } from "./live.js";
import { contextChart, contextExtent, formatTokens, showContextWindow, updateContextChart } from "./charts.js";

const MAX_ROUNDS_PER_FETCH = 50;
const script = pageScript(import.meta.url);
const url = script.dataset.fragments;
const chartData = readJSON("context-chart-data");
const toggle = document.getElementById("context-window-toggle");
// When every call used a sliver of the window, start zoomed to the usage (the bars would be flat).
const initial = contextExtent(chartData);
const chart = contextChart(document.getElementById("context-chart"), chartData, initial.used >= 0.2 * initial.window);

function labelToggle() {
  const { window } = contextExtent(chart.$ctx);
  toggle.hidden = !window;
  toggle.textContent = chart.$windowVisible ? "Zoom to usage" : `Show the whole window (${formatTokens(window)})`;
}
toggle.addEventListener("click", () => {
  showContextWindow(chart, !chart.$windowVisible);
  labelToggle();
});
labelToggle();
const pendingRounds = new Set();
let wholeTimeline = false;

// Place a turn that is not on the page yet in time order (before "outside any turn").
function insertTurn(turn) {
  document.getElementById("timeline-empty")?.remove();
  const timeline = document.getElementById("timeline");
  const started = Number(turn.dataset.started);
  const later = [...timeline.querySelectorAll(":scope > .turn")].find((t) => Number(t.dataset.started) > started);
  timeline.insertBefore(turn, later || null);
}

const refresh = serialised(async () => {
  const params = new URLSearchParams();
  // The fragments are those of the window of turns this page shows (1, the latest, unless given):
  // its findings, its chart, and only its turns (a new turn shows on the latest page only).
  const page = new URLSearchParams(location.search).get("page");
  if (page) params.set("page", page);
  const rounds = [...pendingRounds];
  const whole = wholeTimeline || rounds.length > MAX_ROUNDS_PER_FETCH;
  pendingRounds.clear();
  wholeTimeline = false;
  if (whole) params.set("timeline", "1");
  else if (rounds.length) params.set("rounds", rounds.join(","));
  let json;
  try {
    json = await fetchFragments(`${url}?${params}`);
  } catch (error) {
    // Keep what this fetch was for: the retry (or the next change) asks for it again.
    rounds.forEach((id) => pendingRounds.add(id));
    wholeTimeline ||= whole;
    throw error;
  }
  const missing = applyFragments(json.fragments);
  missing.filter((el) => el.classList.contains("turn")).forEach(insertTurn);
  flash(rounds.map((id) => document.getElementById(`round-${Number(id)}`)).filter(Boolean));
  updateContextChart(chart, json.data.context_chart);
  labelToggle();
});

liveSocket(`/ws/conversations/${Number(script.dataset.conversation)}/`, {
  onOpen: (first) => {
    wholeTimeline ||= !first; // after a reconnect, catch up on everything missed
    refresh();
  },
  onChanges: (changes) => {
    changes.round_ids.forEach((id) => pendingRounds.add(id));
    const unplaced = !changes.round_ids.length && (changes.llm_calls || changes.tool_calls || changes.compression_ids.length);
    wholeTimeline ||= changes.overflow || Boolean(unplaced);
    refresh();
  },
});
