// Chart.js helpers shared by the pages (Chart.js is vendored and loaded as a classic script).
// Colours come from the stylesheet's custom properties so charts match the context bars.

const Chart = window.Chart;

export function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumFractionDigits: 1 });
export const formatTokens = (value) => compact.format(value);

function base(extra = {}) {
  return {
    responsive: true,
    maintainAspectRatio: false,
    animation: false,
    interaction: { mode: "index", intersect: false },
    plugins: { legend: { position: "bottom", labels: { boxWidth: 10, boxHeight: 10 } } },
    ...extra,
  };
}

export function tokensChart(canvas, data) {
  return new Chart(canvas, {
    type: "bar",
    data: {
      labels: data.labels,
      datasets: [
        { label: "Input tokens", data: data.input, backgroundColor: cssVar("--chart-input"), stack: "t" },
        { label: "Output tokens", data: data.output, backgroundColor: cssVar("--chart-output"), stack: "t" },
      ],
    },
    options: base({
      scales: {
        x: { stacked: true, ticks: { maxTicksLimit: 8, maxRotation: 0 } },
        y: { stacked: true, beginAtZero: true, ticks: { callback: formatTokens } },
      },
    }),
  });
}

export function updateTokensChart(chart, data) {
  chart.data.labels = data.labels;
  chart.data.datasets[0].data = data.input;
  chart.data.datasets[1].data = data.output;
  chart.update("none");
}

// USD with enough digits for the cents and fractions of a cent LLM calls cost.
const dollars = new Intl.NumberFormat(undefined, { style: "currency", currency: "USD", maximumSignificantDigits: 3 });
export const formatUsd = (value) => (value === null || value === undefined ? "no price" : dollars.format(value));

// Cost per minute (data.cost, null for a minute whose calls have no price: drawn as a gap).
export function costChart(canvas, data) {
  return new Chart(canvas, {
    type: "bar",
    data: {
      labels: data.labels,
      datasets: [{ label: "Cost (USD)", data: data.cost, backgroundColor: cssVar("--chart-cost") }],
    },
    options: base({
      plugins: {
        legend: { display: false },
        tooltip: { callbacks: { label: (item) => `Cost: ${formatUsd(item.raw)}` } },
      },
      scales: {
        x: { ticks: { maxTicksLimit: 8, maxRotation: 0 } },
        y: { beginAtZero: true, ticks: { callback: formatUsd } },
      },
    }),
  });
}

export function updateCostChart(chart, data) {
  chart.data.labels = data.labels;
  chart.data.datasets[0].data = data.cost;
  chart.update("none");
}

export function histogramChart(canvas, data) {
  return new Chart(canvas, {
    type: "bar",
    data: { labels: data.labels, datasets: [{ label: "Tool calls", data: data.counts, backgroundColor: cssVar("--cat-tool_observations") }] },
    options: base({
      plugins: { legend: { display: false } },
      scales: { x: { ticks: { maxRotation: 0, autoSkip: true } }, y: { beginAtZero: true, ticks: { precision: 0 } } },
    }),
  });
}

export function updateHistogram(chart, data) {
  chart.data.labels = data.labels;
  chart.data.datasets[0].data = data.counts;
  chart.update("none");
}

// Context usage per LLM call: stacked bars by category, the window as a line, compressions as
// triangles above the call they preceded. Each line has a stack of its own, so only the
// category bars add up.
function contextDatasets(data, windowVisible) {
  const sets = data.categories.map((c) => ({
    type: "bar", label: c.label, data: c.values, stack: "ctx", backgroundColor: cssVar(`--cat-${c.key}`), order: 2,
  }));
  if (data.window.some((w) => w)) {
    sets.push({
      type: "line", label: "Window", data: data.window, hidden: !windowVisible,
      borderColor: cssVar("--chart-window"), borderDash: [5, 4],
      borderWidth: 1.5, pointRadius: 0, stepped: "middle", spanGaps: true, order: 1, stack: "window",
    });
  }
  if (data.compressions.length) {
    const points = data.labels.map(() => null);
    const totals = data.labels.map((_, i) => data.categories.reduce((sum, c) => sum + c.values[i], 0));
    for (const c of data.compressions) points[c.index] = Math.max(c.tokens_before, totals[c.index] || 0);
    sets.push({
      type: "line", label: "Compression", data: points, showLine: false, pointStyle: "triangle", pointRadius: 8,
      pointHoverRadius: 10, backgroundColor: cssVar("--chart-compression"), borderColor: "#fff", order: 0, stack: "marker",
    });
  }
  return sets;
}

export function contextChart(canvas, data, windowVisible = true) {
  const chart = new Chart(canvas, {
    data: { labels: data.labels, datasets: contextDatasets(data, windowVisible) },
    options: base({
      scales: {
        x: { stacked: true, ticks: { maxRotation: 0, autoSkip: true } },
        y: { stacked: true, beginAtZero: true, ticks: { callback: formatTokens } },
      },
      plugins: {
        legend: { display: false },
        tooltip: {
          callbacks: {
            label: (item) => {
              if (item.dataset.label === "Compression") {
                const c = chart.$ctx.compressions.find((x) => x.index === item.dataIndex);
                return c ? `Compression (${c.strategy}): ${formatTokens(c.tokens_before)} → ${formatTokens(c.tokens_after)}` : "";
              }
              return `${item.dataset.label}: ${formatTokens(item.raw)}`;
            },
          },
        },
      },
      onClick: (event, elements) => {
        const hit = elements[0];
        if (!hit) return;
        if (chart.data.datasets[hit.datasetIndex].label === "Compression") {
          const c = chart.$ctx.compressions.find((x) => x.index === hit.index);
          if (c) location.assign(c.url);
          return;
        }
        const target = document.getElementById(`llm-${chart.$ctx.ids[hit.index]}`);
        if (target) target.scrollIntoView({ behavior: "smooth", block: "center" });
      },
    }),
  });
  chart.$ctx = data;
  chart.$windowVisible = windowVisible;
  return chart;
}

export function updateContextChart(chart, data) {
  chart.$ctx = data;
  chart.data.labels = data.labels;
  chart.data.datasets = contextDatasets(data, chart.$windowVisible);
  chart.update("none");
}

// Draw the model's maximum (the y axis then reaches it) or zoom the y axis to what was used.
export function showContextWindow(chart, visible) {
  chart.$windowVisible = visible;
  updateContextChart(chart, chart.$ctx);
}

// The largest context used by any call, and the largest window, of a chart's data.
export function contextExtent(data) {
  const used = data.labels.map((_, i) => data.categories.reduce((sum, c) => sum + c.values[i], 0));
  return { used: Math.max(0, ...used), window: Math.max(0, ...data.window.filter(Boolean)) };
}
