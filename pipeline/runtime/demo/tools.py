"""Business-analysis tools for the demo: a sales table, web search, a calculator, artifacts.

`DemoTools(seed)` builds an in-memory SQLite table of made-up sales (2025, four regions of
products and channels) and the LangChain tools over it. Web search answers from canned
results and misbehaves on purpose: a query about competitors is rate-limited twice before it
succeeds (retries), and an industry-report query is slower than its deadline (a timeout).
"""

from __future__ import annotations

import ast
import operator
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from pipeline.runtime.artifact_tool import read_artifact_tool
from pipeline.runtime.artifacts import ArtifactStore
from pipeline.runtime.protocol import ToolError, ToolErrorType

REGIONS = ("EMEA", "Americas", "APAC")
PRODUCTS = {"Atlas": 1200.0, "Beacon": 450.0, "Cobalt": 89.0, "Drift": 2900.0}
CHANNELS = ("direct", "partner", "online")
CUSTOMERS = (
    "Northwind GmbH", "Contoso Ltd", "Fabrikam Inc", "Tailspin Toys", "Wingtip AG", "Litware SA",
    "Adventure Works", "Proseware KK", "Lucerne Publishing", "Margie's Travel", "Humongous Insurance",
    "Blue Yonder Airlines", "Coho Winery", "Trey Research", "Alpine Ski House", "Woodgrove Bank",
)
GROWTH = {"EMEA": 1.09, "Americas": 1.02, "APAC": 1.15}  # quarter-on-quarter demand drift
MAX_QUERY_ROWS = 200
SEARCH_TIMEOUT_MS = 80
SLOW_SEARCH_S = 0.8

SEARCH_RESULTS = {
    "competitor": [
        {"title": "Mid-market BI vendors cut list prices 8-12% in H2 2025", "source": "analyst-weekly.example",
         "snippet": "Three of the five largest mid-market analytics vendors lowered list prices, citing "
                    "slower enterprise budgets; discounting is heaviest in EMEA partner channels."},
        {"title": "Usage-based pricing gains ground", "source": "saas-pricing.example",
         "snippet": "42% of surveyed vendors now offer a usage-based tier; buyers in APAC prefer it."},
        {"title": "Competitor X launches bundle at EUR 990", "source": "news.example",
         "snippet": "The bundle undercuts comparable offerings by roughly 15% for teams of ten."},
    ],
    "emea": [
        {"title": "EMEA software spend up 6.8% in Q3 2025", "source": "market-data.example",
         "snippet": "Growth led by Germany and the Nordics; public sector budgets flat."},
    ],
    "industry report": [
        {"title": "State of analytics 2025 (full report)", "source": "research.example",
         "snippet": "A 140-page report on adoption, pricing and churn across 1,200 companies."},
    ],
}


class DemoTools:
    """The demo's tools and their data; one instance per demo run (nothing global)."""

    def __init__(self, seed: int = 7, rows_per_quarter: int = 1500) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._search_calls: dict[str, int] = {}
        self._fill(random.Random(seed), rows_per_quarter)
        self._db.execute("PRAGMA query_only = ON")

    def _fill(self, rng: random.Random, per_quarter: int) -> None:
        self._db.execute(
            "CREATE TABLE sales (id INTEGER PRIMARY KEY, order_date TEXT, quarter TEXT, region TEXT, "
            "product TEXT, channel TEXT, units INTEGER, unit_price REAL, customer TEXT)"
        )
        rows = []
        for q in range(4):
            start = date(2025, 3 * q + 1, 1)
            for _ in range(per_quarter):
                region = rng.choices(REGIONS, weights=(0.45, 0.35, 0.2))[0]
                product = rng.choice(list(PRODUCTS))
                units = max(1, int(rng.gauss(8, 4) * GROWTH[region] ** q))
                price = round(PRODUCTS[product] * rng.uniform(0.85, 1.05), 2)
                day = start + timedelta(days=rng.randrange(90))
                rows.append((day.isoformat(), f"Q{q + 1}", region, product, rng.choice(CHANNELS), units, price,
                             rng.choice(CUSTOMERS)))
        self._db.executemany(
            "INSERT INTO sales (order_date, quarter, region, product, channel, units, unit_price, customer) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows,
        )
        self._db.commit()

    def sql(self, query: str, params: tuple = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._db.execute(query, params).fetchall()]

    # ---- tools --------------------------------------------------------------------------------

    def query_sales(self, sql: str) -> list[dict[str, Any]]:
        """Run one read-only SQL query (SELECT or WITH) on the `sales` table and return its rows.

        Columns: id, order_date, quarter ('Q1'..'Q4'), region, product, channel, units,
        unit_price, customer. Revenue is SUM(units * unit_price). At most 200 rows.
        """
        statement = sql.strip().rstrip(";")
        if not statement.lower().startswith(("select", "with")) or ";" in statement:
            raise ToolError(ToolErrorType.INVALID_INPUT, "only one SELECT (or WITH) statement is allowed", code="READ_ONLY")
        try:
            rows = self.sql(statement)
        except sqlite3.Error as exc:
            raise ToolError(ToolErrorType.INVALID_INPUT, f"SQL error: {exc}", code="SQL_ERROR") from None
        if len(rows) > MAX_QUERY_ROWS:
            raise ToolError(ToolErrorType.INVALID_INPUT, f"{len(rows)} rows; aggregate, add LIMIT or use export_sales",
                            code="TOO_MANY_ROWS")
        return rows

    def export_sales(self, quarter: str) -> list[dict[str, Any]]:
        """Export every order line of one quarter ('Q1'..'Q4') for offline analysis."""
        if quarter not in ("Q1", "Q2", "Q3", "Q4"):
            raise ToolError(ToolErrorType.INVALID_INPUT, "quarter must be one of Q1, Q2, Q3, Q4")
        return self.sql("SELECT * FROM sales WHERE quarter = ? ORDER BY order_date, id", (quarter,))

    def web_search(self, query: str) -> list[dict[str, str]]:
        """Search the web; returns titles, sources and snippets."""
        key = next((k for k in SEARCH_RESULTS if k in query.lower()), "")
        with self._lock:
            seen = self._search_calls[key] = self._search_calls.get(key, 0) + 1
        if key == "competitor" and seen <= 2:
            raise ToolError(ToolErrorType.RATE_LIMITED, "search provider answered 429 Too Many Requests", code="HTTP_429")
        if key == "industry report":
            time.sleep(SLOW_SEARCH_S)
        return SEARCH_RESULTS.get(key, [])

    @staticmethod
    def calculator(expression: str) -> float:
        """Evaluate arithmetic: numbers, + - * / // % **, parentheses, round(), abs(), min(), max()."""
        return _evaluate(expression)

    def tools(self, artifact_store: ArtifactStore | None = None) -> list[BaseTool]:
        """The tools; `read_artifact` reads from `artifact_store`, the executor's (default: a local store)."""
        return [
            StructuredTool.from_function(self.query_sales, name="query_sales", metadata={"ctxlens_cache_policy": "ttl_short"}),
            StructuredTool.from_function(self.export_sales, name="export_sales"),
            StructuredTool.from_function(
                self.web_search, name="web_search",
                metadata={"ctxlens_timeout_ms": SEARCH_TIMEOUT_MS},  # results change: never cached
            ),
            StructuredTool.from_function(self.calculator, name="calculator"),
            read_artifact_tool(artifact_store, max_chars=8000),
        ]


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"round": round, "abs": abs, "min": min, "max": max}


def _evaluate(expression: str) -> float:
    if len(expression) > 500:
        raise ToolError(ToolErrorType.INPUT_TOO_LARGE, "expression longer than 500 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(ToolErrorType.INVALID_INPUT, f"not an arithmetic expression: {expression!r}") from None

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ToolError(ToolErrorType.INVALID_INPUT, "exponent too large")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
            return _FUNCTIONS[node.func.id](*(walk(arg) for arg in node.args))
        raise ToolError(ToolErrorType.INVALID_INPUT, f"unsupported element in expression: {type(node).__name__}")

    try:
        result = walk(tree)
    except ZeroDivisionError:
        raise ToolError(ToolErrorType.INVALID_INPUT, "division by zero") from None
    return float(result)
