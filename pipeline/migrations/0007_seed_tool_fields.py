"""The design documents' tool fields: ToolCall.input_tokens (their ToolMetrics.input_tokens), and
stored tool error types renamed to their ToolErrorType names, so old and new rows group together."""

from __future__ import annotations

from django.db import migrations, models

# ctxlens's earlier names → the documents' (as in pipeline.runtime.protocol when this was written).
RENAMED_ERROR_TYPES = {
    "rate_limited": "rate_limit",
    "transient": "transient_error",
    "resource_unavailable": "resource_error",
    "invalid_input": "invalid_parameters",
    "internal": "internal_error",
}


def rename_error_types(apps, schema_editor) -> None:
    ToolCall = apps.get_model("pipeline", "ToolCall")
    for old, new in RENAMED_ERROR_TYPES.items():
        ToolCall.objects.filter(error_type=old).update(error_type=new)


class Migration(migrations.Migration):

    dependencies = [
        ("pipeline", "0006_compression_and_skills"),
    ]

    operations = [
        migrations.AddField(
            model_name="toolcall",
            name="input_tokens",
            field=models.IntegerField(default=0),
        ),
        # Not reversed: the old names still read (pipeline.runtime.protocol.ToolErrorType).
        migrations.RunPython(rename_error_types, migrations.RunPython.noop, elidable=True),
    ]
