"""Skills on disk: `<skills_dir>/<name>/SKILL.md` (YAML front matter + body) plus scripts/,
references/ and assets/, read at three levels of detail.

Level 1 is the front matter (`SkillMetadata`, a one-line listing); level 2 the SKILL.md body
(`Skill.instructions()`); level 3 one resource file (`Skill.read_resource()`), which never
leaves the skill's directory. Real paths never appear in a return value or an error message.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from pipeline.runtime.settings import runtime_settings
from pipeline.runtime.protocol import ContextModifier
from pipeline.tokens.counting import count_tokens

logger = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
SKILL_NAME_RE = re.compile(r"\A[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?\Z")
RESOURCE_DIRS = ("scripts", "references", "assets")
MAX_SKILL_FILE_BYTES = 512 * 1024
MAX_RESOURCE_BYTES = 256 * 1024
ACTIVATE_TOOL = "activate_skill"
RESOURCE_TOOL = "read_skill_resource"
SKILL_TOOLS = frozenset({ACTIVATE_TOOL, RESOURCE_TOOL})  # callable under any skill's allowed-tools


class SkillError(Exception):
    """A skill could not be loaded or activated; the message is safe to show to the model."""


class SkillNotFound(SkillError):
    pass


class SkillCycleError(SkillError):
    def __init__(self, path: Sequence[str]) -> None:
        self.path = list(path)
        super().__init__(f"Circular skill activation: {' → '.join(self.path)}")


class SkillDepthError(SkillError):
    def __init__(self, path: Sequence[str], max_depth: int) -> None:
        self.path = list(path)
        super().__init__(f"Skill activation deeper than {max_depth}: {' → '.join(self.path)}")


def parse_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """Split SKILL.md into its YAML front matter (a mapping) and the Markdown body."""
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise SkillError("SKILL.md must start with YAML front matter between '---' lines")
    for end, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            break
    else:
        raise SkillError("SKILL.md front matter is not closed with '---'")
    try:
        data = yaml.safe_load("".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise SkillError(f"SKILL.md front matter is not valid YAML: {exc.__class__.__name__}") from None
    if not isinstance(data, dict):
        raise SkillError("SKILL.md front matter must be a mapping")
    return data, "".join(lines[end + 1 :]).strip("\n")


def _names(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part for part in re.split(r"[,\s]+", value) if part]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SkillError(f"'{key}' must be a list of names or a comma-separated string")
    return tuple(item.strip() for item in value)


@dataclass(frozen=True)
class SkillMetadata:
    """Level 1: what the front matter says."""

    name: str
    description: str
    allowed_tools: frozenset[str] | None = None
    model: str | None = None
    disable_model_invocation: bool = False
    requires: tuple[str, ...] = ()

    @classmethod
    def from_front_matter(cls, data: dict[str, Any]) -> SkillMetadata:
        def get(key: str) -> Any:
            return data.get(key, data.get(key.replace("-", "_")))

        name, description = get("name"), get("description")
        if not isinstance(name, str) or not SKILL_NAME_RE.match(name):
            raise SkillError("'name' must be lower-case letters, digits and hyphens (at most 64)")
        if not isinstance(description, str) or not description.strip():
            raise SkillError(f"skill {name}: 'description' is required")
        tools = get("allowed-tools")
        model = get("model")
        if model is not None and not isinstance(model, str):
            raise SkillError(f"skill {name}: 'model' must be a string")
        return cls(
            name=name,
            description=" ".join(description.split()),
            allowed_tools=None if tools is None else frozenset(_names(tools, "allowed-tools")),
            model=model or None,
            disable_model_invocation=bool(get("disable-model-invocation") or False),
            requires=_names(get("requires"), "requires"),
        )

    @property
    def listing(self) -> str:
        return f"- {self.name}: {self.description}"

    def context_modifier(self) -> ContextModifier:
        # The skill tools stay callable under any skill, or nested activation could never happen.
        tools = None if self.allowed_tools is None else self.allowed_tools | SKILL_TOOLS
        return ContextModifier(
            allowed_tools=tools, model=self.model, disable_model_invocation=self.disable_model_invocation
        )


@dataclass(frozen=True)
class Skill:
    metadata: SkillMetadata
    directory: Path  # never shown to a model or a user

    @property
    def name(self) -> str:
        return self.metadata.name

    def instructions(self) -> str:
        """Level 2: the SKILL.md body."""
        return parse_front_matter(_read_text(self.directory / SKILL_FILE, MAX_SKILL_FILE_BYTES))[1]

    def resources(self) -> list[str]:
        """Level 3 files, as paths relative to the skill (e.g. 'references/metrics.md')."""
        root = self.directory.resolve()
        found: list[str] = []
        for sub in RESOURCE_DIRS:
            base = self.directory / sub
            if not base.is_dir() or base.is_symlink():
                continue
            for path in sorted(base.rglob("*")):
                rel = path.relative_to(self.directory)
                if any(part.startswith(".") for part in rel.parts) or not path.is_file():
                    continue
                if path.resolve().is_relative_to(root):
                    found.append(rel.as_posix())
        return found

    def read_resource(self, relative: str) -> str:
        """Level 3: one resource's text; binary files are described, never dumped."""
        with self._resource_path(relative).open("rb") as fh:
            data = fh.read(MAX_RESOURCE_BYTES + 1)  # however much the file grew since it was checked
        if len(data) > MAX_RESOURCE_BYTES:
            raise SkillError(f"resource {relative} of skill {self.name} is larger than {MAX_RESOURCE_BYTES} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return f"[binary asset {relative}: {len(data)} bytes]"

    def _resource_path(self, relative: str) -> Path:
        bad = SkillNotFound(f"skill {self.name} has no resource {relative!r}")
        if not isinstance(relative, str) or not relative or "\x00" in relative or "\\" in relative:
            raise bad
        rel = PurePosixPath(relative)
        if rel.is_absolute() or ".." in rel.parts or rel.parts[0] not in RESOURCE_DIRS:
            raise bad
        root = self.directory.resolve()
        try:
            path = (self.directory / rel).resolve(strict=True)
        except (OSError, RuntimeError):
            raise bad from None
        if not path.is_relative_to(root) or not path.is_file():
            raise bad
        return path


def _read_text(path: Path, limit: int) -> str:
    with path.open("rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise SkillError(f"{SKILL_FILE} is larger than {limit} bytes")
    return data.decode("utf-8", errors="replace")


class SkillRegistry:
    """The skills found under one directory (CTXLENS_SKILLS_DIR by default), read at level 1.

    A skill that fails to load is left out and described in `problems`; it never stops the others.
    """

    def __init__(self, skills_dir: Path | str | None = None) -> None:
        self.skills_dir = Path(skills_dir) if skills_dir is not None else runtime_settings().skills_dir
        self.skills: dict[str, Skill] = {}
        self.problems: list[str] = []
        if not self.skills_dir.is_dir():
            return
        for directory in sorted(p for p in self.skills_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if not (directory / SKILL_FILE).is_file():
                continue
            try:
                front, _ = parse_front_matter(_read_text(directory / SKILL_FILE, MAX_SKILL_FILE_BYTES))
                metadata = SkillMetadata.from_front_matter(front)
                if metadata.name != directory.name:
                    raise SkillError(f"front matter names '{metadata.name}'; the directory must have that name")
            except (SkillError, OSError) as exc:
                self.problems.append(f"{directory.name}: {exc}")
                logger.warning("Skipping skill %s: %s", directory.name, exc)
                continue
            self.skills[metadata.name] = Skill(metadata, directory)

    def __contains__(self, name: object) -> bool:
        return name in self.skills

    def get(self, name: str) -> Skill:
        try:
            return self.skills[name]
        except (KeyError, TypeError):
            raise SkillNotFound(f"no skill named {name!r}") from None

    def for_model(self) -> list[SkillMetadata]:
        """Level 1 of every skill the model may activate itself."""
        return [s.metadata for s in self.skills.values() if not s.metadata.disable_model_invocation]

    def listing(self) -> str:
        return "\n".join(m.listing for m in self.for_model())

    def level_tokens(self, name: str, model: str) -> dict[int, int]:
        """Tokens each level of one skill costs: {1: listing, 2: instructions, 3: all resources}."""
        skill = self.get(name)
        resources = sum(count_tokens(skill.read_resource(rel), model) for rel in skill.resources())
        return {
            1: count_tokens(skill.metadata.listing, model),
            2: count_tokens(skill.instructions(), model),
            3: resources,
        }
