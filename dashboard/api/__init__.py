"""The REST API (DRF): ingest and read endpoints under /api/."""
