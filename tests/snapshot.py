"""Every stored record of one ctxlens installation in a form two installations can be compared in.

Database ids and the times a row was written here are left out; foreign keys become the
natural key of the row they point to, so a record exported from one ctxlens and ingested by
another compares equal field by field.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.db import models

from pipeline.models import (
    Artifact,
    CompressionEvent,
    Conversation,
    LLMCall,
    Round,
    SkillActivation,
    Span,
    ToolCall,
)

# Written by this installation when the row was stored, not carried by the trace.
LOCAL_FIELDS = {"id", "created_at", "received_at", "last_accessed_at", "expires_at", "source", "tokens_pending",
                # background work's bookkeeping: when it has run differs between installations
                "findings_stale", "finding_counts", "finding_count", "levels_pending",
                # read off this installation's artifact files, which an export does not carry
                "tokens_at_level"}


# Rows are compared in the order of their natural keys, so one differing field shows as itself.
SORT_KEYS = ("external_id", "conversation", "key", "artifact_id", "trace_id", "span_id", "seq")


def natural_key(obj: models.Model | None) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Conversation):
        return obj.external_id
    if isinstance(obj, Round):
        return [obj.conversation.external_id, obj.key]
    if isinstance(obj, Artifact):
        return obj.artifact_id
    return [obj.trace_id, obj.span_id]  # LLMCall and the other span rows


def _value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc).isoformat()
    if isinstance(value, Decimal):
        return str(value)  # a cost: exact, and JSON has no decimals
    return value


def rows(model: type[models.Model]) -> list[dict[str, Any]]:
    out = []
    for obj in model.objects.all():
        row: dict[str, Any] = {}
        for field in model._meta.concrete_fields:
            if field.name in LOCAL_FIELDS:
                continue
            if field.is_relation:
                row[field.name] = natural_key(getattr(obj, field.name))
            else:
                row[field.name] = _value(getattr(obj, field.attname))
        out.append(row)
    return sorted(out, key=lambda row: repr([row.get(name) for name in SORT_KEYS]))


def snapshot() -> dict[str, list[dict[str, Any]]]:
    return {
        model.__name__: rows(model)
        for model in (Conversation, Round, LLMCall, ToolCall, CompressionEvent, SkillActivation, Span, Artifact)
    }
