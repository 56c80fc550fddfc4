// The live socket every page shares: one websocket, reconnecting by itself with backoff, and
// helpers to fetch the page's server-rendered fragments and swap them in.
//
// Fragments are HTML that Django rendered with autoescaping (the same partials as on first
// load). They are parsed with DOMParser, which never runs scripts, and moved into the page as
// nodes; no string of trace content is ever assigned as HTML here.

const LOGIN_URL = "/login/";
const CLOSE_UNAUTHENTICATED = 4401;
const CLOSE_NOT_FOUND = 4404;
const PING_EVERY_MS = 30000;

function setStatus(state, text) {
  const el = document.getElementById("live-status");
  if (!el) return;
  el.dataset.state = state;
  el.textContent = text;
}

export function goToLogin() {
  const next = encodeURIComponent(location.pathname + location.search);
  location.assign(`${LOGIN_URL}?next=${next}`);
}

// Open `path` (e.g. "/ws/live/") and keep it open. onOpen(first) runs on every (re)connect so
// the page can catch up on what it missed; onChanges(message) runs for each "changes" message.
export function liveSocket(path, { onOpen = () => {}, onChanges = () => {} } = {}) {
  let delay = 500;
  let opened = false;
  let ping = null;
  const connect = () => {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}${path}`);
    socket.addEventListener("message", (event) => {
      let message;
      try { message = JSON.parse(event.data); } catch { return; }
      if (message.type === "hello") {
        delay = 500;
        if (Number.isFinite(message.refresh_ms) && message.refresh_ms >= 0) refreshGapMs = message.refresh_ms;
        setStatus("live", "live");
        const first = !opened;
        opened = true;
        onOpen(first);
      } else if (message.type === "changes") {
        onChanges(message);
      }
    });
    socket.addEventListener("open", () => {
      ping = setInterval(() => socket.readyState === WebSocket.OPEN && socket.send('{"type":"ping"}'), PING_EVERY_MS);
    });
    socket.addEventListener("close", (event) => {
      clearInterval(ping);
      if (event.code === CLOSE_UNAUTHENTICATED) { setStatus("offline", "logged out"); goToLogin(); return; }
      if (event.code === CLOSE_NOT_FOUND) { setStatus("offline", "not found"); return; }
      setStatus("reconnecting", "reconnecting…");
      const wait = delay * (0.75 + Math.random() / 2);
      delay = Math.min(delay * 2, 10000);
      setTimeout(connect, wait);
    });
  };
  connect();
}

// Run `task` now, or once more after the current run if one is in flight: never two at once,
// never a queue of stale refreshes, and a run starts at least `refreshGapMs` after the last one
// ended (the server's "hello" sets it: CTXLENS_LIVE_REFRESH_MS). The websocket says within a few
// tens of milliseconds that something changed; the first change after a quiet spell is fetched
// at once, and under a steady stream of changes each page fetches at its own pace, so a hundred
// open pages do not turn every commit into a hundred page renders (in a hidden tab the browser
// stretches the pause to its timer throttling, a second or more). A run that fails (the server
// restarting, a proxy error) is tried again after a growing pause, so the page does not stay
// behind until the next change.
const RETRY_FIRST_MS = 1000;
const RETRY_MAX_MS = 30000;
let refreshGapMs = 250;

class LoggedOut extends Error {}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export function serialised(task) {
  let running = null;
  let again = false;
  let retryIn = RETRY_FIRST_MS;
  let retry = null;
  let lastEnd = -Infinity;
  const run = () => {
    if (running) { again = true; return running; }
    clearTimeout(retry);
    running = (async () => {
      do {
        // From the end of the last run, so a slow server (a render taking longer than the gap)
        // still gets a pause from every page between its fetches.
        const wait = lastEnd + refreshGapMs - performance.now();
        if (wait > 0) await sleep(wait);
        again = false;  // what changed while this run waited, it fetches
        try {
          await task();
          retryIn = RETRY_FIRST_MS;
        } catch (error) {
          console.warn("ctxlens: live refresh failed", error);
          if (error instanceof LoggedOut) break;
          retry = setTimeout(run, retryIn);
          retryIn = Math.min(retryIn * 2, RETRY_MAX_MS);
          break;
        } finally {
          lastEnd = performance.now();
        }
      } while (again);
      running = null;
    })();
    return running;
  };
  return run;
}

export async function fetchFragments(url) {
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (response.status === 401) { goToLogin(); throw new LoggedOut("logged out"); }
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

// Swap each fragment's root element (found by id) into the page. Returns the new elements
// whose id is not on the page yet, for the caller to place.
export function applyFragments(fragments) {
  const missing = [];
  for (const [id, html] of Object.entries(fragments || {})) {
    const parsed = new DOMParser().parseFromString(html, "text/html");
    const fresh = parsed.getElementById(id);
    if (!fresh) continue;
    const current = document.getElementById(id);
    const node = document.adoptNode(fresh);
    if (current) current.replaceWith(node); else missing.push(node);
  }
  return missing;
}

export function flash(elements) {
  for (const el of elements) {
    el.classList.remove("flash");
    void el.offsetWidth; // restart the animation
    el.classList.add("flash");
  }
}

// JSON a template embedded with Django's json_script filter.
export function readJSON(id) {
  const el = document.getElementById(id);
  return el ? JSON.parse(el.textContent) : null;
}

// The <script type="module"> tag that loaded a page module, for its data-* attributes.
export function pageScript(moduleUrl) {
  // The page's <script type="module"> for the module at `moduleUrl` (its import.meta.url): the
  // file name carries a content hash in production, so match the whole resolved URL.
  return [...document.querySelectorAll('script[type="module"]')].find((script) => script.src === moduleUrl);
}
