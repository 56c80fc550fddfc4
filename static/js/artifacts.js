// Artifacts list: new artifacts appear while the first page is shown.
import { applyFragments, fetchFragments, liveSocket, pageScript, serialised } from "./live.js";

const url = pageScript(import.meta.url).dataset.fragments;
const onFirstPage = () => (document.getElementById("artifact-results")?.dataset.page ?? "1") === "1";

const refresh = serialised(async () => {
  const json = await fetchFragments(url + location.search);
  applyFragments(json.fragments);
});

liveSocket("/ws/live/", {
  onOpen: () => onFirstPage() && refresh(),
  onChanges: (changes) => onFirstPage() && changes.tool_calls > 0 && refresh(),
});
