"""Skills with progressive disclosure (pipeline.runtime.skills.loader) and activation (pipeline.runtime.skills.activation).

    registry = SkillRegistry()                 # CTXLENS_SKILLS_DIR, level 1 of every skill
    session = SkillSession(registry, model="gpt-4o")
    session.activate("sales-analysis")         # level 2, nested `requires`, cycle and depth checks
    session.modifier                           # the active skills' ContextModifier, or None
    session.drain_messages()                   # HumanMessages to inject into the conversation
    session.tools()                            # activate_skill / read_skill_resource for the model
"""

from pipeline.runtime.skills.activation import (
    MAX_DEPTH,
    SkillActivation,
    SkillActivationStack,
    SkillMessage,
    SkillSession,
    filter_tools,
)
from pipeline.runtime.skills.loader import (
    ACTIVATE_TOOL,
    RESOURCE_DIRS,
    RESOURCE_TOOL,
    SKILL_TOOLS,
    Skill,
    SkillCycleError,
    SkillDepthError,
    SkillError,
    SkillMetadata,
    SkillNotFound,
    SkillRegistry,
    parse_front_matter,
)

__all__ = [
    "ACTIVATE_TOOL", "MAX_DEPTH", "RESOURCE_DIRS", "RESOURCE_TOOL", "SKILL_TOOLS", "Skill", "SkillActivation",
    "SkillActivationStack", "SkillCycleError", "SkillDepthError", "SkillError", "SkillMessage", "SkillMetadata",
    "SkillNotFound", "SkillRegistry", "SkillSession", "filter_tools", "parse_front_matter",
]
