"""The demo's conversations: scripted model turns over the demo tools, run through the real agent loop.

Five conversations of a business analyst with the agent. Between them they produce what the
dashboard is for: skill activation (nested, with a level-3 resource), a permission denial, a
rate-limited search that succeeds on the third attempt, a search that times out, a tool error
the model recovers from, a cache hit, a large export stored as an artifact and read back, and
context compression (extracts now, the background summary from the next round).
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from langchain_core.messages import BaseMessage, ToolMessage

from pipeline.runtime.agent import Agent, AgentRound
from pipeline.runtime.artifacts import ArtifactStore, LocalArtifactStore
from pipeline.runtime.cache import Cache, InMemoryCache
from pipeline.runtime.compression import CompressionStrategy
from pipeline.runtime.demo.fake_model import ScriptedChatModel, Step, calls, tool_call
from pipeline.runtime.demo.tools import DemoTools
from pipeline.runtime.skills import SkillRegistry
from pipeline.runtime.summariser import Summariser
from pipeline.runtime.telemetry.spans import Telemetry
from pipeline.runtime.executor import RetryPolicy

SYSTEM_PROMPT = (
    "You are a business analyst agent for a software company. Answer from the company's sales "
    "table and cited sources; never invent figures. Activate a skill when a task matches it."
)
AGENT_NAME = "sales-analyst"
USER_ID = "demo-analyst"
DEMO_RETRY_POLICY = RetryPolicy(max_retries=2, initial_delay_s=0.02, backoff_multiplier=1.5, max_delay_s=0.1)
ARTIFACT_RE = re.compile(r"artifact_[0-9a-f]{16,64}")


@dataclass
class Turn:
    user: str
    script: Sequence[Step]
    activate: Sequence[str] = ()


@dataclass
class Conversation:
    title: str
    turns: list[Turn]
    model: str = "gpt-4o-mini"
    strategy: CompressionStrategy = CompressionStrategy.EXTRACT
    summarise: bool = False
    output_levels: dict[str, str] = field(default_factory=dict)


@dataclass
class DemoReport:
    conversations: int = 0
    rounds: list[AgentRound] = field(default_factory=list)
    conversation_ids: list[str] = field(default_factory=list)

    def count(self, predicate: Callable[[AgentRound], int]) -> int:
        return sum(predicate(r) for r in self.rounds)

    def line(self) -> str:
        tools = self.count(lambda r: len(r.tool_results))
        failed = self.count(lambda r: sum(not t.success for t in r.tool_results))
        retries = self.count(lambda r: sum(t.retry_count for t in r.tool_results))
        artifacts = self.count(lambda r: sum(bool(t.artifact_id) for t in r.tool_results))
        compressions = self.count(lambda r: len(r.compressions))
        skills = self.count(lambda r: len(r.skill_activations))
        return (
            f"{self.conversations} conversations, {len(self.rounds)} rounds, {tools} tool calls "
            f"({failed} failed, {retries} retries), {artifacts} artifacts, {compressions} compressions, "
            f"{skills} skill activations"
        )


def last_artifact_id(messages: list[BaseMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ToolMessage) and (found := ARTIFACT_RE.search(str(message.content))):
            return found.group(0)
    raise RuntimeError("no artifact in the conversation yet")


def read_window(offset: int, limit: int = 8000) -> Callable[[list[BaseMessage]], object]:
    return lambda messages: calls(
        tool_call("read_artifact", {"artifact_id": last_artifact_id(messages), "offset": offset, "limit": limit}),
        thought=f"Reading characters {offset} to {offset + limit} of the export.",
    )


def money(value: float) -> str:
    return f"EUR {value / 1e6:.2f}M" if value >= 1e6 else f"EUR {value / 1e3:.0f}k"


def conversations(data: DemoTools) -> list[Conversation]:
    revenue_sql = (
        "SELECT quarter, region, ROUND(SUM(units * unit_price), 2) AS revenue FROM sales "
        "WHERE quarter IN ('Q2', 'Q3') GROUP BY quarter, region ORDER BY region, quarter"
    )
    revenue = {(r["quarter"], r["region"]): r["revenue"] for r in data.sql(revenue_sql)}
    growth = {
        region: round((revenue["Q3", region] - revenue["Q2", region]) / revenue["Q2", region] * 100, 1)
        for region in ("EMEA", "Americas", "APAC")
    }
    product_sql = (
        "SELECT product, quarter, ROUND(SUM(units * unit_price), 2) AS revenue FROM sales "
        "WHERE region = 'EMEA' AND quarter IN ('Q2', 'Q3') GROUP BY product, quarter"
    )
    by_product = {(r["product"], r["quarter"]): r["revenue"] for r in data.sql(product_sql)}
    driver = max({p for p, _ in by_product}, key=lambda p: by_product[p, "Q3"] - by_product[p, "Q2"])
    total_sql = "SELECT ROUND(SUM(units * unit_price), 2) AS revenue FROM sales"
    total = data.sql(total_sql)[0]["revenue"]
    top_sql = (
        "SELECT customer, product, units, ROUND(units * unit_price, 2) AS revenue FROM sales "
        "WHERE quarter = 'Q4' ORDER BY revenue DESC LIMIT 3"
    )
    top = data.sql(top_sql)
    discount_sql = (
        "SELECT product, ROUND(AVG(unit_price), 2) AS avg_price FROM sales "
        "WHERE region = 'EMEA' AND channel = 'partner' GROUP BY product ORDER BY product"
    )
    northwind_sql = (
        "SELECT quarter, ROUND(SUM(units * unit_price), 2) AS revenue FROM sales "
        "WHERE customer = 'Northwind GmbH' GROUP BY quarter ORDER BY quarter"
    )
    northwind = data.sql(northwind_sql)
    growth_calls = [
        tool_call("calculator", {"expression": f"({revenue['Q3', r]} - {revenue['Q2', r]}) / {revenue['Q2', r]} * 100"})
        for r in ("EMEA", "Americas", "APAC")
    ]
    report = (
        f"## Q3 revenue grew in every region, led by APAC ({growth['APAC']:+.1f} %)\n\n**Key figures**\n"
        + "".join(f"- {r}: {money(revenue['Q3', r])} in Q3 2025, {growth[r]:+.1f} % on Q2\n" for r in growth)
        + "\n**Drivers**\nVolume growth in APAC and EMEA; prices stable across products.\n\n"
        "**Next steps**\nReview partner discounts in EMEA; plan APAC capacity for Q4."
    )
    return [
        Conversation("Regional revenue report", [
            Turn("How did revenue develop from Q2 to Q3 by region? I need a short report for the board.", [
                calls(tool_call("activate_skill", {"name": "sales-analysis"}), thought="A sales question: loading the sales-analysis skill."),
                calls(tool_call("read_skill_resource", {"skill": "sales-analysis", "path": "references/schema.md"})),
                calls(tool_call("query_sales", {"sql": revenue_sql}), thought="Revenue per region for Q2 and Q3."),
                calls(tool_call("web_search", {"query": "EMEA software market Q3 2025"}), thought="Market context for EMEA."),
                calls(*growth_calls, thought="Web search is not allowed in this skill; computing growth from the table."),
                calls(tool_call("activate_skill", {"name": "report-writing"}), thought="Now the report for the board."),
                calls(tool_call("read_skill_resource", {"skill": "report-writing", "path": "assets/report-template.md"})),
                report,
            ]),
            Turn("Which product drove the EMEA growth?", [
                calls(tool_call("query_sales", {"sql": product_sql})),
                f"{driver} drove EMEA: {money(by_product[driver, 'Q2'])} in Q2 → {money(by_product[driver, 'Q3'])} in Q3.",
            ]),
        ]),
        Conversation("Competitor pricing", [
            Turn("What are analysts saying about competitors' pricing? Is there an industry report?", [
                calls(tool_call("web_search", {"query": "competitor pricing mid-market analytics H2 2025"})),
                calls(tool_call("web_search", {"query": "industry report analytics pricing 2025"})),
                "Analysts report list-price cuts of 8–12 % by three large mid-market vendors in H2 2025, heaviest in "
                "EMEA partner channels, and a competitor bundle at EUR 990 about 15 % below comparable offers. "
                "The industry-report search timed out, so I could not check the full report.",
            ]),
            Turn("Compare that with our own average prices in the EMEA partner channel.", [
                calls(tool_call("query_sales", {"sql": discount_sql})),
                calls(tool_call("calculator", {"expression": "(1200 - 1140) / 1200 * 100"}), thought="Discount on Atlas vs list."),
                "Our EMEA partner prices sit about 5 % under list on average, less than the competitors' 8–12 % cuts.",
            ]),
        ]),
        Conversation("Q4 order export", [
            Turn("Export all Q4 order lines and tell me the three largest.", [
                calls(tool_call("export_sales", {"quarter": "Q4"}), thought="Exporting the quarter; it is large."),
                read_window(0, 2000),
                calls(tool_call("query_sales", {"sql": top_sql}), thought="Ranking lines in SQL instead of reading everything."),
                "Q4 is exported as an artifact. Largest lines: "
                + "; ".join(f"{t['customer']} ({t['product']}, {money(t['revenue'])})" for t in top) + ".",
            ]),
        ], output_levels={"export_sales": "full"}),
        Conversation("Key account deep dive", [
            Turn("Export Q3 and walk me through the order lines, part by part.", [
                calls(tool_call("export_sales", {"quarter": "Q3"})), read_window(0),
                "Part 1 covers early July: mostly Atlas and Drift, direct channel, EMEA-heavy.",
            ]),
            Turn("Continue with the next part.", [read_window(8000), "Part 2: mid-July, more partner-channel Beacon deals."]),
            Turn("And the next part.", [read_window(16000), "Part 3: late July, APAC picks up with online Cobalt orders."]),
            Turn("What do we know about Northwind GmbH?", [
                calls(tool_call("query_sales", {"sql": northwind_sql})),
                "Northwind GmbH: " + ", ".join(f"{r['quarter']} {money(r['revenue'])}" for r in northwind) + ".",
            ]),
        ], model="gpt-4", strategy=CompressionStrategy.SUMMARIZE, summarise=True,
            output_levels={"export_sales": "full", "read_artifact": "full"}),
        Conversation("Quick numbers", [
            Turn("What is our total 2025 revenue, and what would 12 % growth on it be?", [
                calls(tool_call("query_sales", {"sql": "SELECT SUM(units * unit_price) AS revenue FROM sale"})),
                calls(tool_call("query_sales", {"sql": total_sql}), thought="Typo in the table name; again."),
                calls(tool_call("calculator", {"expression": f"{total} * 1.12"})),
                f"Total 2025 revenue is {money(total)}; 12 % growth would make it {money(total * 1.12)}.",
            ]),
            Turn("Remind me of the total?", [calls(tool_call("query_sales", {"sql": total_sql})), f"{money(total)}."]),
        ]),
    ]


def summary_model() -> ScriptedChatModel:
    """The demo's summariser: picks the user's requests and the tools used out of the transcript."""

    def summarise(messages: list[BaseMessage]) -> str:
        transcript = str(messages[-1].content)
        asks = [line.removeprefix("human: ") for line in transcript.splitlines() if line.startswith("human: ")]
        tools = sorted(set(re.findall(r"\[calls: (\w+)", transcript)))
        return (
            f"The analyst asked: {' / '.join(asks) or 'to continue'}. Tools used: {', '.join(tools) or 'none'}. "
            "The Q3 export was read in 8,000-character parts; each part was summarised in the answers."
        )

    return ScriptedChatModel(messages=itertools.repeat(summarise), model_name="gpt-4o-mini")


def run_demo(
    telemetry: Telemetry,
    *,
    seed: int = 7,
    on_round: Callable[[str, AgentRound], None] | None = None,
    cache: Cache | None = None,
    artifact_store: ArtifactStore | None = None,
    on_worker_exit: Callable[[], None] | None = None,
) -> DemoReport:
    """Run every conversation. The adapters are the executor's (pipeline.runtime.executor); without
    them the conversations share one in-memory cache and keep artifacts in a local store."""
    cache = InMemoryCache() if cache is None else cache
    artifact_store = LocalArtifactStore() if artifact_store is None else artifact_store
    data = DemoTools(seed=seed)
    registry = SkillRegistry()
    report = DemoReport()
    for conversation in conversations(data):
        model = ScriptedChatModel.from_script(
            [step for turn in conversation.turns for step in turn.script], model_name=conversation.model
        )
        summariser = Summariser(summary_model(), model=conversation.model, cache=cache) if conversation.summarise else None
        agent = Agent(
            model, data.tools(artifact_store), system_prompt=SYSTEM_PROMPT, conversation_id=f"demo-{uuid.uuid4().hex[:12]}",
            agent_name=AGENT_NAME, user_id=USER_ID, skills=registry, compression_strategy=conversation.strategy,
            summariser=summariser, retry_policy=DEMO_RETRY_POLICY, telemetry=telemetry,
            output_levels=conversation.output_levels,
            cache=cache, artifact_store=artifact_store, on_worker_exit=on_worker_exit,
        )
        for turn in conversation.turns:
            round_ = agent.turn(turn.user, activate=turn.activate)
            report.rounds.append(round_)
            if on_round:
                on_round(conversation.title, round_)
            if summariser:
                summariser.wait(10)  # the analyst reads the answer; the summary is ready by the next round
        if summariser:
            summariser.close()
        report.conversations += 1
        report.conversation_ids.append(agent.conversation_id)
    return report
