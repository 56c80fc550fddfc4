"""What is wrong with a conversation's context: findings computed from its stored calls.

    findings = conversation_findings(conversation)   # [Finding(code, severity, message, ...)]
    for conversation_id, rows in read_conversations(ids):   # many at once, the same findings
        findings = findings_of(conversations[conversation_id], rows)

Every check reads the calls' message digests (pipeline.ingest.normalise.digest) and a few
columns, never the messages, observations or compression bodies, which can be megabytes: three
queries (pipeline.insight.conversation_rows) and one pass over what each input adds to the one it
extends, so the work grows with calls + messages while inputs extend each other. An input that
does not (a compression, a cache break, a new stream) is read and diffed whole: a conversation
whose every call breaks the cache costs what all its inputs weigh together.

"The previous call" of a call is the previous call of its stream (conversation_rows.read_streams),
the one the call-to-call diff compares with too: a tool that calls a model itself, or a sub-agent,
is a stream of its own and is never compared with the agent's loop. A call with the same input and
output (digest, or tool call ids) as the call it follows is that call recorded twice (a
framework's span and the provider SDK's span inside it): it is checked once, as the first.

Codes and severities. `error`: the input breaks the tool-calling protocol, which providers
reject (OpenAI answers 400) or which shows the model a result that answers nothing.
`warning`: tokens, money or turns are being wasted, or the run is about to fail. `info`: worth
knowing, already costed by a warning of its own.

- `orphan_tool_result` (error): a tool message whose tool_call_id no earlier assistant message
  of the same input asked for (typically left behind when a compression dropped the call).
  Reported once per id, at the first input that carries it.
- `missing_tool_result` (error): a tool call an LLM call asked for with no tool message
  answering it in the input of the next LLM call of its stream: the first whose input adds to
  its input, else the first that does not extend it; not checked when that input was not
  recorded, nor in a call that only sends the same input again (a retry).
- `duplicate_tool_call_id` (error): two tool calls with one id in the conversation: asked for
  by the model twice, or executed twice.
- `repeated_tool_call` (warning): one tool with identical arguments 3 or more times in one turn.
- `oversized_observation` (warning): one observation over CTXLENS_OVERSIZED_OBSERVATION_RATIO
  (default 25 %) of the model's context window. Observations whose tokens are still being
  counted (pipeline.ingest.write.deferred) are judged once they are counted.
- `cache_break` (warning): an input that does not extend the previous call's, with no
  compression recorded between the two calls to explain it (diff.Compressions.explain); the
  message names the tokens of the messages both inputs share past the break, which a prompt
  cache held and can no longer serve. None when there are none: nothing a cache held was lost.
- `system_prompt_changed` (info): the first system message differs from the previous call's
  (its cost shows as the cache_break it causes).
- `near_window_limit` (warning): a call's context at 90 % or more of its window with no
  compression after it; one finding, on the latest such call.
- `retry_storm` (warning): one tool failing 3 or more times in one turn with the same error
  (type, code and message): the agent keeps retrying a call that keeps failing.

Findings come in the order of the time of the call they are about.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from pipeline.conf import ctxlens_config
from pipeline.insight.conversation_rows import (
    WINDOW_LOOKBACK,
    CallRow,
    ConversationRows,
    Entry,
    ToolRow,
    full_call_from,
    read_conversation,
)
from pipeline.insight.diff import CallInput, Compressions, diff_inputs
from pipeline.models import Conversation
from pipeline.tokens.counting import context_window

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITIES = (ERROR, WARNING, INFO)
# code → severity, in the order findings of one moment are listed.
CODES: dict[str, str] = {
    "orphan_tool_result": ERROR,
    "missing_tool_result": ERROR,
    "duplicate_tool_call_id": ERROR,
    "repeated_tool_call": WARNING,
    "oversized_observation": WARNING,
    "cache_break": WARNING,
    "system_prompt_changed": INFO,
    "near_window_limit": WARNING,
    "retry_storm": WARNING,
}
REPEATED_CALLS = 3  # identical tool calls in one turn
RETRY_STORM_FAILURES = 3  # failures of one tool with one error in one turn
NEAR_WINDOW_SHARE = 0.9
ARGUMENTS_SHOWN = 80  # characters of a repeated call's arguments quoted in its message



@dataclass(frozen=True)
class Finding:
    """One thing wrong with the conversation, and the call it is about.

    `tool_call_id` is the id the model gave the tool call; `tool_call` the stored ToolCall row
    (its timeline entry), when there is one.
    """

    code: str
    severity: str
    message: str
    round_id: int | None = None
    llm_call_id: int | None = None
    tool_call_id: str | None = None
    tool_call: int | None = None
    at: datetime | None = field(default=None, compare=False)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["at"]
        return data


def finding_counts(findings: Iterable[Finding]) -> dict[str, int]:
    """{code: how many}, codes in CODES order."""
    counts: dict[str, int] = defaultdict(int)
    for finding in findings:
        counts[finding.code] += 1
    return {code: counts[code] for code in CODES if counts[code]}


def conversation_findings(conversation: Conversation, since: datetime | None = None,
                          until: datetime | None = None) -> list[Finding]:
    """Every finding of `conversation`, in the order of the time of the call each is about.

    With `since` / `until`, the findings about calls in [since, until) only (a page's window of
    turns), computed from the calls of that span and the WINDOW_LOOKBACK before it, so the work
    does not grow with the conversation. Checks that look across the whole conversation see only
    that much of it: a tool call id also used before the lookback is not a duplicate there. Every
    compression after the lookback's start counts, and one query tells whether a full call follows
    the span, so near_window_limit names the call the whole conversation's check names (its count
    of full calls counts the calls read only).
    """
    if since is None and until is None:
        return findings_of(conversation, read_conversation(conversation.pk))
    rows = read_conversation(conversation.pk, since, until, lookback=WINDOW_LOOKBACK)
    checks = _Checks(conversation, rows.calls, rows.tools, rows.compressions, rows.calls_before)
    # near_window_limit is about the latest full call since the last compression: not a call of
    # an older page when a full call follows the page (a compression between them would have
    # followed the page's calls too).
    checks.full_later = until is not None and full_call_from(conversation.pk, until, NEAR_WINDOW_SHARE)
    found = checks.run()
    return [f for f in found if f.at is None or ((since is None or f.at >= since) and (until is None or f.at < until))]


def findings_of(conversation: Conversation, rows: ConversationRows) -> list[Finding]:
    """Every finding of `conversation` from all of its rows, as read by read_conversation(id) or, for
    many conversations in a few queries, read_conversations(ids): conversation_findings(conversation)."""
    return _Checks(conversation, rows.calls, rows.tools, rows.compressions).run()


def _ids(digest: list[Entry], key: str) -> list[str]:
    return [str(i) for entry in digest for i in entry.get(key, ())]


def _protocol_ids(digest: list[Entry]) -> tuple[set[str], set[str]]:
    """The tool calls an input's assistant messages ask for, and those its tool messages answer."""
    return set(_ids(digest, "requests")), set(_ids(digest, "answers"))


def _same_output(a: CallRow, b: CallRow) -> bool:
    """Whether two calls gave one output: the same digest, or the same tool calls by id (ids are
    minted per response; two instrumentations may print a tool call's arguments differently)."""
    if a.output == b.output:
        return True
    requests = _ids(a.output, "requests")
    return bool(requests) and requests == _ids(b.output, "requests")


# Bidirectional-text controls (LRE … RLO, LRI … PDI, LRM, RLM, ALM): dropped from the trace text
# a message quotes, so a tool named "report\u202efdp.exe" cannot reorder the sentence around it.
_BIDI_CONTROLS = dict.fromkeys(map(ord, "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"))


def _plain(text: str) -> str:
    """Trace text as a message quotes it: without bidirectional-text controls."""
    return text.translate(_BIDI_CONTROLS)


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}"


class _Checks:
    """One conversation's calls, read once, and the checks over them."""

    def __init__(self, conversation: Conversation, calls: list[CallRow], tools: list[ToolRow],
                 compressions: Compressions, calls_before: int = 0) -> None:
        self.conversation = conversation
        self.calls = calls
        self.tools = tools
        self.compressions = compressions
        # "LLM call #n" in messages: n counts the conversation's calls, read or not.
        self.number = {call.pk: n for n, call in enumerate(calls, calls_before + 1)}
        self.calls_by_id = {call.pk: call for call in calls}
        self.starts = [call.started_at for call in calls]
        self.tools_by_id: dict[str, list[ToolRow]] = defaultdict(list)
        for tool in tools:
            if tool.tool_call_id:
                self.tools_by_id[tool.tool_call_id].append(tool)
        # A call with the input and output of the call it follows is that call recorded again (a
        # framework's span and the provider SDK's span inside it): checked once, as the first.
        self.duplicate_of: dict[int, CallRow] = {}
        for call in calls:
            previous = call.previous
            if call.added == [] and previous is not None and _same_output(previous, call):
                self.duplicate_of[call.pk] = self.duplicate_of.get(previous.pk, previous)
        self.recorded = [call for call in calls if call.pk not in self.duplicate_of]
        self.found: list[Finding] = []
        self.full_later = False  # a call after those read filled its window (near_window_limit)

    def previous(self, call: CallRow) -> CallRow | None:
        """The call `call` follows in its stream, as first recorded."""
        previous = call.previous
        return None if previous is None else self.duplicate_of.get(previous.pk, previous)

    def run(self) -> list[Finding]:
        self.protocol()
        self.duplicate_ids()
        self.repeated_and_failing_tools()
        self.oversized_observations()
        self.input_changes()
        self.near_window_limit()
        order = {code: i for i, code in enumerate(CODES)}
        return sorted(self.found, key=lambda f: (f.at, order[f.code], f.llm_call_id or 0, f.tool_call or 0,
                                                 f.tool_call_id or "", f.message))

    def add(self, code: str, message: str, at: datetime, *, call: CallRow | None = None,
            tool: ToolRow | None = None, tool_call_id: str | None = None) -> None:
        round_id = call.round_id if call is not None else tool.round_id if tool is not None else None
        llm_call_id = call.pk if call is not None else tool.llm_call_id if tool is not None else None
        if tool_call_id is None and tool is not None:
            tool_call_id = tool.tool_call_id or None
        if tool is None and tool_call_id is not None and len(self.tools_by_id.get(tool_call_id, ())) == 1:
            tool = self.tools_by_id[tool_call_id][0]
        self.found.append(Finding(code, CODES[code], message, round_id, llm_call_id, tool_call_id,
                                  tool.pk if tool is not None else None, at))

    def named(self, tool_call_id: str) -> str:
        """`call_1 (search)` when a stored tool call tells the tool's name, else `call_1`."""
        tools = self.tools_by_id.get(tool_call_id)
        return f"{_plain(tool_call_id)} ({_plain(tools[0].tool_name)})" if tools else _plain(tool_call_id)

    def next_call(self, previous: CallRow, call: CallRow) -> str:
        """How a message names `call`, the call after `previous` in its stream."""
        n = self.number[call.pk]
        adjacent = n == self.number[previous.pk] + 1
        return f"the next LLM call, #{n}" if adjacent else f"the next LLM call of its stream, #{n}"

    # --- the tool-calling protocol -------------------------------------------------------

    def answerers(self) -> dict[int, CallRow]:
        """{call id: the call whose input must answer its tool calls}: the first call of its stream
        after it whose input extends its input with more messages (the agent's next step), else
        the first whose input does not extend it. A call that sends the same input again (a retry
        that dropped the output) answers nothing and is no next step."""
        answerer: dict[int, CallRow] = {}
        for call in self.recorded:
            previous = self.previous(call)
            if previous is None or not call.input or call.added == []:  # not recorded, or sent again
                continue
            chosen = answerer.get(previous.pk)
            if chosen is None or (chosen.added is None and call.added is not None):
                answerer[previous.pk] = call
        return answerer

    def protocol(self) -> None:
        """Orphan and missing tool results. The tool calls an input asks for and the results it
        carries are kept from one input to the next that extends it, so each message is looked at
        once (twice where two calls extend one input)."""
        reported: set[str] = set()
        # Per call: the tool calls the assistant messages of its input ask for, and those its tool
        # messages answer; handed on to the call that extends it.
        state: dict[int, tuple[set[str], set[str]]] = {}
        answerer = self.answerers()
        asks = {answering.pk: self.calls_by_id[pk] for pk, answering in answerer.items()}
        for call in self.calls:
            previous = call.previous
            if call.added is None or previous is None:
                asked, answered, new = set(), set(), call.input
            elif previous.pk in state:
                asked, answered = state.pop(previous.pk)
                new = call.added
            else:  # a second call extending one input: read the input again
                asked, answered = _protocol_ids(previous.input)
                new = call.added
            for entry in new:
                requests, answers = entry.get("requests"), entry.get("answers")
                if requests:
                    asked.update(map(str, requests))
                for answer in map(str, answers or ()):
                    answered.add(answer)
                    if answer not in asked and answer not in reported:
                        reported.add(answer)
                        self.add("orphan_tool_result",
                                 f"The input of LLM call #{self.number[call.pk]} has a tool result for "
                                 f"{self.named(answer)}, but no earlier assistant message in it asked for that "
                                 f"tool call.", call.started_at, call=call, tool_call_id=answer)
            state[call.pk] = (asked, answered)
            asking = asks.get(call.pk)
            if asking is not None:
                self.missing_results(asking, call, asked, answered)

    def missing_results(self, asking: CallRow, call: CallRow, asked: set[str], answered: set[str]) -> None:
        for wanted in dict.fromkeys(_ids(asking.output, "requests")):
            if wanted in answered:
                continue
            where = ("carries that tool call but no tool result answering it" if wanted in asked
                     else "has no tool result for it")
            self.add("missing_tool_result",
                     f"LLM call #{self.number[asking.pk]} asked for tool call {self.named(wanted)}; the input of "
                     f"{self.next_call(asking, call)}, {where}.", call.started_at, call=call, tool_call_id=wanted)

    def duplicate_ids(self) -> None:
        asked: dict[str, list[CallRow]] = defaultdict(list)
        for call in self.recorded:
            for tool_call_id in _ids(call.output, "requests"):
                asked[tool_call_id].append(call)
        for tool_call_id in sorted(asked.keys() | self.tools_by_id.keys()):
            by_model, executed = asked.get(tool_call_id, []), self.tools_by_id.get(tool_call_id, [])
            if len(by_model) >= 2:
                second = by_model[1]
                numbers = list(dict.fromkeys(f"#{self.number[c.pk]}" for c in by_model))
                calls = f"LLM call{'s' if len(numbers) > 1 else ''} {', '.join(numbers)}"
                self.add("duplicate_tool_call_id",
                         f"The tool call id {_plain(tool_call_id)} is used by {len(by_model)} tool calls of the model "
                         f"({calls}): a tool result cannot say which one it answers.",
                         second.started_at, call=second, tool_call_id=tool_call_id)
            elif len(executed) >= 2:
                second = executed[1]
                self.add("duplicate_tool_call_id",
                         f"The tool call id {_plain(tool_call_id)} is used by {len(executed)} executed tool calls "
                         f"({', '.join(sorted({_plain(t.tool_name) for t in executed}))}): a tool result cannot say "
                         f"which one it answers.", second.started_at, tool=second)

    # --- tools ---------------------------------------------------------------------------

    def repeated_and_failing_tools(self) -> None:
        same_tool: dict[tuple, list[ToolRow]] = defaultdict(list)
        same_error: dict[tuple, list[ToolRow]] = defaultdict(list)
        for tool in self.tools:
            same_tool[(tool.round_id, tool.tool_name)].append(tool)
            if not tool.success:
                same_error[(tool.round_id, tool.tool_name, tool.error_type, tool.error_code,
                            tool.error_message)].append(tool)
        for (_, name), tools in same_tool.items():
            if len(tools) >= REPEATED_CALLS:  # else no arguments can repeat: they are not decoded
                self.repeated_calls(name, tools)
        for (_, name, error_type, error_code, error_message), tools in same_error.items():
            if len(tools) >= RETRY_STORM_FAILURES:
                error = ": ".join(part for part in (error_type or error_code, error_message[:200]) if part)
                attempts = sum(1 + t.retry_count for t in tools)
                extra = f"; {attempts} attempts counting the executor's retries" if attempts > len(tools) else ""
                self.add("retry_storm",
                         f"{_plain(name)} failed {len(tools)} times in one turn with the same error"
                         f"{f' ({_plain(error)})' if error else ''}{extra}.",
                         tools[RETRY_STORM_FAILURES - 1].started_at, tool=tools[RETRY_STORM_FAILURES - 1])

    def repeated_calls(self, name: str, tools: list[ToolRow]) -> None:
        """Calls of one tool in one turn (`tools`, in time order) that repeat the same arguments."""
        same_call: dict[str, list[ToolRow]] = defaultdict(list)
        for tool in tools:
            same_call[json.dumps(tool.arguments, sort_keys=True, ensure_ascii=False, default=str)].append(tool)
        for arguments, repeated in same_call.items():
            if len(repeated) >= REPEATED_CALLS:
                shown = arguments if len(arguments) <= ARGUMENTS_SHOWN else arguments[:ARGUMENTS_SHOWN - 1] + "…"
                self.add("repeated_tool_call",
                         f"{_plain(name)} was called {len(repeated)} times in one turn with the same arguments "
                         f"{_plain(shown)}.",
                         repeated[REPEATED_CALLS - 1].started_at, tool=repeated[REPEATED_CALLS - 1])

    def window_of(self, call: CallRow | None) -> int:
        model = (call.model if call is not None else "") or self.conversation.model
        return (call.context_window if call is not None else None) or context_window(model)

    def window_for_tool(self, tool: ToolRow) -> int:
        """The window of the LLM call that asked for the tool, else of the first call after it,
        else the one the conversation's model has."""
        call = self.calls_by_id.get(tool.llm_call_id)
        if call is None and self.calls:
            later = bisect_left(self.starts, tool.started_at)
            call = self.calls[min(later, len(self.calls) - 1)]
        return self.window_of(call)

    def oversized_observations(self) -> None:
        ratio = ctxlens_config().oversized_observation_ratio
        for tool in self.tools:
            if not tool.observation_tokens:
                continue
            window = self.window_for_tool(tool)
            if window and tool.observation_tokens > ratio * window:
                self.add("oversized_observation",
                         f"The observation of {_plain(tool.tool_name)} is {tool.observation_tokens:,} tokens: "
                         f"{_share(tool.observation_tokens, window)} of the {window:,}-token context window "
                         f"(the limit is {ratio:.0%}).", tool.started_at, tool=tool)

    # --- consecutive inputs of a stream --------------------------------------------------

    def input_changes(self) -> None:
        system: dict[int, Entry | None] = {}  # each call's first system message
        for call in self.calls:
            previous = call.previous
            if call.added is not None and previous is not None and system[previous.pk] is not None:
                system[call.pk] = system[previous.pk]
            else:
                system[call.pk] = next((e for e in (call.input if call.added is None else call.added)
                                        if e.get("role") == "system"), None)
            previous = self.previous(call)
            if call.pk in self.duplicate_of or previous is None or not previous.input or not call.input:
                continue  # an input not recorded says nothing
            self.system_prompt(previous, call, system[previous.pk], system[call.pk])
            if call.added is None and not self.compressions.explain(previous, call):
                self.cache_break(previous, call)

    def cache_break(self, prev: CallRow, cur: CallRow) -> None:
        diff = diff_inputs(CallInput(prev.pk, prev.input, prev.input_tokens), CallInput(cur.pk, cur.input, cur.input_tokens))
        # No tokens of shared messages past the break: nothing a prompt cache held was lost.
        if diff["cache_break"] and diff["uncacheable_tokens"]:
            self.add("cache_break",
                     f"The input of LLM call #{self.number[cur.pk]} does not extend the input of call "
                     f"#{self.number[prev.pk]}: it keeps the first {diff['kept_prefix_messages']} of its "
                     f"{len(prev.input)} messages and no compression explains the change; "
                     f"{diff['uncacheable_tokens']:,} tokens of messages both inputs share sit past that point and "
                     f"can no longer come from a prompt cache.", cur.started_at, call=cur)

    def system_prompt(self, prev: CallRow, call: CallRow, old: Entry | None, new: Entry | None) -> None:
        if old is None and new is None or (old and new and old.get("hash") == new.get("hash")):
            return
        n = self.number[prev.pk]
        if old is None:
            change = f"has a system message; call #{n} had none"
        elif new is None:
            change = f"has no system message; call #{n} had one"
        else:
            change = f"differs from call #{n}'s ({old.get('bytes', 0):,} → {new.get('bytes', 0):,} bytes)"
        self.add("system_prompt_changed", f"The system message of LLM call #{self.number[call.pk]} {change}.",
                 call.started_at, call=call)

    def near_window_limit(self) -> None:
        last_compression = self.compressions.times[-1] if self.compressions.times else None
        full = []
        for call in self.recorded:
            if last_compression is not None and last_compression >= call.started_at:
                continue  # a compression followed it
            window = self.window_of(call)
            used = call.context_tokens or call.input_tokens
            if window and used >= NEAR_WINDOW_SHARE * window:
                full.append((call, used, window))
        if not full or self.full_later:
            return
        call, used, window = full[-1]
        more = (f"; {len(full)} calls reached {NEAR_WINDOW_SHARE:.0%} or more since the last compression"
                if len(full) > 1 else "")
        self.add("near_window_limit",
                 f"LLM call #{self.number[call.pk]} filled {used:,} of its {window:,}-token context window "
                 f"({_share(used, window)}) and no compression followed{more}.", call.started_at, call=call)
