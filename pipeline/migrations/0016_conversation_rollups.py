"""The conversations' rollups (kind "conversation": each conversation counted in the bucket of its
last activity, pipeline.rollups.figures), built for the conversations stored before them."""

from django.db import migrations


def rebuild(apps, schema_editor):
    """Runs the current code, so only where there are conversations (as 0014_rollups does)."""
    if not apps.get_model("pipeline", "Conversation").objects.exists():
        return
    from pipeline.rollups.compact import rebuild_rollups
    from pipeline.rollups.figures import CONVERSATION

    rebuild_rollups(kinds=[CONVERSATION])


class Migration(migrations.Migration):

    dependencies = [
        ('pipeline', '0015_conversation_call_indexes'),
    ]

    operations = [
        migrations.RunPython(rebuild, migrations.RunPython.noop),
    ]
