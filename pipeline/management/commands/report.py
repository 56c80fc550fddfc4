"""The human-readable metrics report: `python manage.py report [--conversation ID] [--since 7d]`."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from pipeline.models import Conversation
from pipeline.report import conversation_report, global_report
from pipeline.stats import parse_window


class Command(BaseCommand):
    help = (
        "Print the metrics report: tokens, tool calls (failed, retried), per-tool statistics, skills, "
        "messages and compressions, of one conversation (--conversation) or of all of them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--conversation", metavar="ID",
            help="The conversation's id as the agent sent it (gen_ai.conversation.id, session.id, REST "
                 "conversation_id), or its number in the dashboard's address.",
        )
        parser.add_argument("--since", metavar="WINDOW", help="Without --conversation: only conversations active "
                                                               "in this window, e.g. 1h, 7d.")

    def handle(self, *args: object, conversation: str | None = None, since: str | None = None, **options: object) -> None:
        if conversation is not None:
            if since:
                raise CommandError("--since applies to the overall report, not to one --conversation")
            self.stdout.write(conversation_report(self._conversation(conversation)))
            return
        start = None
        if since:
            try:
                start = timezone.now() - parse_window(since)
            except ValueError as error:
                raise CommandError(f"--since: {error}") from None
        self.stdout.write(global_report(start))

    @staticmethod
    def _conversation(identifier: str) -> Conversation:
        found = Conversation.objects.filter(external_id=identifier).first()
        if found is None and identifier.isdigit():
            found = Conversation.objects.filter(pk=int(identifier)).first()
        if found is None:
            raise CommandError(f"no conversation {identifier!r}")
        return found
