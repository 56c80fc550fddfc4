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

// The ids of the rounds whose turns the page lists, oldest first.
function shownRounds() {
  return [...document.querySelectorAll("#timeline > .turn")]
    .map((turn) => /^round-(\d+)$/.exec(turn.id)?.[1]).filter(Boolean);
}

// Keep the timeline on the window of turns that the fragments (the chart, the findings) describe:
// the latest page drops the turns that left it as new ones came. Returns whether the whole timeline
// must be fetched: the pager's count of pages changed, or turns left while the page shows "outside
// any turn" (the records of no turn in the window's span of time, which moved with them).
function followWindow(win) {
  const keep = new Set(win.rounds.map(String));
  let dropped = false;
  for (const turn of document.querySelectorAll("#timeline > .turn")) {
    const round = /^round-(\d+)$/.exec(turn.id)?.[1];
    if (round && !keep.has(round)) {
      turn.remove();
      dropped = true;
    }
  }
  const line = document.getElementById("timeline-window");
  if (line) line.textContent = `Showing turns ${win.first}–${win.last} of ${win.total}.`;
  const moved = document.getElementById("timeline-moved");
  if (moved) moved.hidden = !win.moved;
  const pages = Number(document.getElementById("timeline").dataset.pages);
  return win.pages !== pages || (dropped && document.getElementById("round-none") !== null);
}

const refresh = serialised(async () => {
  const params = new URLSearchParams();
  // The fragments are those of the window of turns this page holds (1, the latest, unless given):
  // its findings, its chart, and only its turns (a new turn shows on the latest page only). The
  // turns it lists tell the server which: an older page keeps them as the pages move on.
  const page = new URLSearchParams(location.search).get("page");
  if (page) params.set("page", page);
  params.set("shown", shownRounds().join(","));
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
  if (followWindow(json.data.turn_window)) {
    wholeTimeline = true;
    refresh();
  }
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
