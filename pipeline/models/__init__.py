from pipeline.models.apikeys import ApiKey
from pipeline.models.artifacts import Artifact
from pipeline.models.calls import LLMCall, ToolCall, ToolRequest
from pipeline.models.carries import ToolResultCarry
from pipeline.models.conversations import Conversation, Round, Status
from pipeline.models.rollups import Rollup
from pipeline.models.events import CompressionEvent, SkillActivation
from pipeline.models.spans import Span, SpanKind, SpanLog

__all__ = [
    "ApiKey",
    "Artifact",
    "CompressionEvent",
    "Conversation",
    "LLMCall",
    "Rollup",
    "Round",
    "SkillActivation",
    "Span",
    "SpanKind",
    "SpanLog",
    "Status",
    "ToolCall",
    "ToolRequest",
    "ToolResultCarry",
]
