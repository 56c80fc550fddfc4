from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from pipeline.models import Artifact, LLMCall, Round, Span, ToolCall
from tests.factories import make_artifact, make_conversation

pytestmark = pytest.mark.django_db


def test_it_rejects_a_duplicate_trace_and_span_id():
    Span.objects.create(trace_id="a" * 32, span_id="b" * 16, name="chat", start_time=timezone.now())
    with pytest.raises(IntegrityError):
        Span.objects.create(trace_id="a" * 32, span_id="b" * 16, name="again", start_time=timezone.now())


def test_the_same_span_id_in_another_trace_is_a_different_span():
    Span.objects.create(trace_id="a" * 32, span_id="b" * 16, name="one", start_time=timezone.now())
    Span.objects.create(trace_id="c" * 32, span_id="b" * 16, name="two", start_time=timezone.now())
    assert Span.objects.count() == 2


@pytest.mark.parametrize("model, extra", [(LLMCall, {}), (ToolCall, {"tool_name": "search"})])
def test_llm_and_tool_calls_are_unique_per_span(model, extra):
    conversation = make_conversation()
    fields = {"conversation": conversation, "trace_id": "d" * 32, "span_id": "e" * 16, "started_at": timezone.now()}
    model.objects.create(**fields, **extra)
    with pytest.raises(IntegrityError), transaction.atomic():
        model.objects.create(**fields, **extra)
    assert model.objects.count() == 1


def test_a_round_key_is_unique_within_its_conversation_only():
    first, second = make_conversation("c1"), make_conversation("c2")
    Round.objects.create(conversation=first, key="t1", started_at=timezone.now())
    Round.objects.create(conversation=second, key="t1", started_at=timezone.now())
    with pytest.raises(IntegrityError):
        Round.objects.create(conversation=first, key="t1", started_at=timezone.now())


@pytest.mark.django_db(transaction=True)
def test_deleting_an_artifact_row_deletes_its_file(artifact_dir):
    artifact = make_artifact(artifact_dir, b"large tool output")
    path = artifact_dir / artifact.artifact_id
    assert path.exists()
    artifact.delete()
    assert not path.exists()


@pytest.mark.django_db(transaction=True)
def test_a_bulk_delete_removes_every_file(artifact_dir):
    paths = [artifact_dir / make_artifact(artifact_dir, f"output {i}".encode()).artifact_id for i in range(3)]
    Artifact.objects.all().delete()
    assert not any(p.exists() for p in paths)


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_delete_keeps_the_file(artifact_dir):
    artifact = make_artifact(artifact_dir, b"keep me")
    with pytest.raises(RuntimeError), transaction.atomic():
        artifact.delete()
        raise RuntimeError("roll back")
    assert (artifact_dir / artifact.artifact_id).exists()
    assert Artifact.objects.filter(artifact_id=artifact.artifact_id).exists()


@pytest.mark.parametrize(
    "artifact_id, valid",
    [
        ("artifact_" + "0" * 32, True),
        ("artifact_../../etc/passwd", False),
        ("artifact_" + "A" * 32, False),
        ("/tmp/artifact_" + "0" * 32, False),
        ("artifact_" + "0" * 32 + "\n", False),
    ],
)
def test_artifact_ids_are_validated(artifact_id, valid):
    assert Artifact.is_valid_id(artifact_id) is valid
