"""Rollups maintained at ingest: per time bucket and per tool, model and compression strategy, and
the conversations by their last activity (pipeline.models.Rollup).

    track     the hooks that keep them in step with every write of a call or a conversation
    figures   what one call contributes; Figures, the sums that add and subtract
    sketch    the DDSketch-style latency histogram (p50 / p95 / p99 within 2 %)
    read      windowed figures: rollups inside the window, raw calls at its edges
    compact   ageing minute and hour rows out; rebuilding from the calls
"""
