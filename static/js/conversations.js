// Conversations list: rows arrive and change live while the first page is shown.
import { applyFragments, fetchFragments, flash, liveSocket, pageScript, serialised } from "./live.js";

const url = pageScript(import.meta.url).dataset.fragments;
const changed = new Set();

const onFirstPage = () => (document.getElementById("conversation-results")?.dataset.page ?? "1") === "1";

const refresh = serialised(async () => {
  const ids = [...changed];
  changed.clear();
  const json = await fetchFragments(url + location.search);
  applyFragments(json.fragments);
  flash(ids.map((id) => document.querySelector(`tr[data-conversation="${Number(id)}"]`)).filter(Boolean));
});

liveSocket("/ws/live/", {
  onOpen: () => onFirstPage() && refresh(),
  onChanges: (changes) => {
    if (!onFirstPage() || !changes.conversation_ids.length) return;
    changes.conversation_ids.forEach((id) => changed.add(id));
    refresh();
  },
});
