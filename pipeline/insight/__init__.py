"""Why the context looks the way it does: per-message digests of what each LLM call saw, the
diff between consecutive calls, findings, cost and what-if figures, computed from stored rows."""
