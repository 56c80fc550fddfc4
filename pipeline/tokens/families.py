"""Which model family a name belongs to, each family's encoding, safety margin and context
window, and the overrides read from the YAML file named by CTXLENS_TOKEN_ENCODERS_FILE.

File shape (see config/token_encoders.yaml; every key optional):

    families:                     # built-in families to adjust, or new ones
      claude: {margin: 1.1}
      my-family: {encoding: cl100k_base, margin: 1.3, context_window: 32768}
    models:                       # glob on the lower-cased name or its model id; first match wins
      "gpt-4.1*": {context_window: 1047576}
      "acme-*": {family: my-family}

The design document's format is read too (see `parse_token_config`):

    encoders:
      my-custom-model: {model_family: custom, encoding_name: my_encoding, safety_margin: 1.3,
                        use_exact_counting: true}

Only encodings that load offline are accepted: cl100k_base, o200k_base and those registered
with `pipeline.tokens.encodings.register_encoding`. Validation errors name the bad entry,
never the file's path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from pipeline.tokens import encodings

DEFAULT_ENCODING = "cl100k_base"
FALLBACK_FAMILY = "custom"


@dataclass(frozen=True)
class FamilySettings:
    encoding: str
    margin: float
    context_window: int


# Margins: claude/gpt/gemini/glm/qwen from the design document. Llama 3's tokenizer is a
# superset of cl100k (Llama 2's is a 32k SentencePiece), mistral's 32k SentencePiece / Tekken
# vocabularies split more finely, DeepSeek's 128k BPE is close to qwen's. Windows are the
# providers' documented defaults; per-model exceptions are in _MODEL_WINDOWS.
BUILTIN_FAMILIES: Mapping[str, FamilySettings] = MappingProxyType({
    "claude": FamilySettings(DEFAULT_ENCODING, 1.15, 200_000),
    "gpt": FamilySettings(DEFAULT_ENCODING, 1.0, 128_000),
    "gemini": FamilySettings(DEFAULT_ENCODING, 1.2, 1_048_576),
    "glm": FamilySettings(DEFAULT_ENCODING, 1.25, 128_000),
    "qwen": FamilySettings(DEFAULT_ENCODING, 1.2, 131_072),
    "llama": FamilySettings(DEFAULT_ENCODING, 1.1, 131_072),
    "mistral": FamilySettings(DEFAULT_ENCODING, 1.25, 131_072),
    "deepseek": FamilySettings(DEFAULT_ENCODING, 1.2, 128_000),
    FALLBACK_FAMILY: FamilySettings(DEFAULT_ENCODING, 1.2, 128_000),
})

# Leftmost match in a name segment wins; "ollama" is a runtime, not a llama.
_FAMILY_RE = re.compile(
    r"(?P<claude>claude)"
    r"|(?P<gpt>gpt|(?<![a-z0-9])o[1345](?![a-z0-9])|davinci|babbage)"
    r"|(?P<gemini>gemini|gemma)"
    r"|(?P<glm>glm|zhipu)"
    r"|(?P<qwen>qwen|qwq)"
    r"|(?P<llama>(?<!o)llama)"
    r"|(?P<mistral>mistral|mixtral|codestral|ministral|pixtral|magistral|devstral)"
    r"|(?P<deepseek>deepseek)"
)

# (family, regex searched in the model id, window). First match wins; order matters.
_MODEL_WINDOWS: tuple[tuple[str, re.Pattern[str], int], ...] = tuple(
    (family, re.compile(pattern), window)
    for family, pattern, window in (
        ("claude", r"^claude-(2\.0|instant)", 100_000),
        ("gpt", r"^gpt-4\.1", 1_047_576),
        ("gpt", r"^gpt-5", 400_000),
        ("gpt", r"^gpt-4o|^gpt-4-(turbo|1106|0125|vision)", 128_000),
        ("gpt", r"^gpt-4-32k", 32_768),
        ("gpt", r"^gpt-4(-|$)", 8_192),
        ("gpt", r"^gpt-3\.5-turbo-instruct", 4_096),
        ("gpt", r"^gpt-3\.5", 16_385),
        ("gpt", r"^gpt-oss", 131_072),
        ("gpt", r"^o1-(mini|preview)", 128_000),
        ("gpt", r"^o[1345]", 200_000),
        ("gemini", r"^gemini-1\.5-pro", 2_097_152),
        ("gemini", r"^gemini-(1\.0|pro($|-))", 32_760),
        ("gemini", r"^gemma-?3", 131_072),
        ("gemini", r"^gemma", 8_192),
        ("glm", r"^glm-4-long", 1_000_000),
        ("glm", r"^glm-4\.[56]", 200_000),
        ("glm", r"^glm-?3-6b-32k", 32_768),
        ("glm", r"^glm-?3", 8_192),
        ("qwen", r"^qwen-max", 32_768),
        ("qwen", r"^qwen-turbo", 1_000_000),
        ("llama", r"^llama-?4.*scout", 10_000_000),
        ("llama", r"^llama-?4", 1_048_576),
        ("llama", r"^llama-?3\.[1-3]", 131_072),
        ("llama", r"^llama-?3", 8_192),
        ("llama", r"^llama-?2", 4_096),
        ("mistral", r"^mixtral-8x22b", 65_536),
        ("mistral", r"^(mixtral|mistral-7b|open-mistral-7b)", 32_768),
        ("mistral", r"^codestral", 262_144),
    )
)


class TokenConfigError(ValueError):
    """The token encoders YAML file is unreadable or does not follow the schema."""


@dataclass(frozen=True)
class ModelOverride:
    pattern: str  # a glob matched against the lower-cased model name and its model id
    family: str | None = None
    encoding: str | None = None
    margin: float | None = None
    context_window: int | None = None
    exact_counting: bool | None = None  # the design document's use_exact_counting
    exact_counting_api: str | None = None  # kept for the counter a user registers (never called here)


@dataclass(frozen=True)
class TokenConfig:
    families: Mapping[str, FamilySettings] = field(default_factory=lambda: BUILTIN_FAMILIES)
    models: tuple[ModelOverride, ...] = ()



# ---- the YAML file --------------------------------------------------------------------------

def _number(where: str, value: Any, *, minimum: float, maximum: float, integer: bool = False) -> Any:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not minimum <= value <= maximum:
        kind = "an integer" if integer else "a number"
        raise TokenConfigError(f"{where} must be {kind} between {minimum:g} and {maximum:g}, got {value!r}")
    return value


def _encoding(where: str, value: Any) -> str:
    if not isinstance(value, str) or not encodings.is_available(value):
        raise TokenConfigError(
            f"{where} {value!r} is not available offline (available: {', '.join(encodings.available())})"
        )
    return encodings.canonical(value)


def _mapping_of(where: str, raw: Any, allowed: set[str]) -> dict[str, Any]:
    """`raw` as a mapping with no key outside `allowed`."""
    if not isinstance(raw, dict):
        raise TokenConfigError(f"{where} must be a mapping")
    unknown = set(raw) - allowed
    if unknown:
        raise TokenConfigError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    return raw


def _settings(where: str, raw: Any, allowed: set[str]) -> dict[str, Any]:
    raw = _mapping_of(where, raw, allowed)
    out: dict[str, Any] = {}
    if "encoding" in raw:
        out["encoding"] = _encoding(f"{where}.encoding", raw["encoding"])
    if "margin" in raw:
        out["margin"] = float(_number(f"{where}.margin", raw["margin"], minimum=1.0, maximum=10.0))
    if "context_window" in raw:
        out["context_window"] = _number(
            f"{where}.context_window", raw["context_window"], minimum=1, maximum=100_000_000, integer=True
        )
    if "family" in raw:
        out["family"] = raw["family"]
    return out


# The design document's format: `encoders: {<model or glob>: EncoderConfig}`.
SEED_KEYS = {"model_family", "encoding_name", "safety_margin", "use_exact_counting", "exact_counting_api",
             "encoder_params"}
SEED_FAMILY_ALIASES = {"mistal": "mistral"}  # the design document's ModelFamily.MISTRAL value


def _seed_encoder(pattern: Any, raw: Any, families: Mapping[str, FamilySettings]) -> ModelOverride:
    """One `encoders:` entry (EncoderConfig fields) as a model override."""
    where = f"encoders[{pattern!r}]"
    raw = _mapping_of(where, raw, SEED_KEYS)
    values: dict[str, Any] = {}
    if "encoding_name" in raw:
        values["encoding"] = _encoding(f"{where}.encoding_name", raw["encoding_name"])
    if "safety_margin" in raw:
        values["margin"] = float(_number(f"{where}.safety_margin", raw["safety_margin"], minimum=1.0, maximum=10.0))
    family = raw.get("model_family")
    if family is not None:
        family = SEED_FAMILY_ALIASES.get(str(family).lower(), str(family).lower())
        if family not in families:
            raise TokenConfigError(f"{where}.model_family {raw['model_family']!r} is neither built in nor defined")
    exact = raw.get("use_exact_counting")
    if exact is not None and not isinstance(exact, bool):
        raise TokenConfigError(f"{where}.use_exact_counting must be true or false")
    api = raw.get("exact_counting_api")
    if api is not None and not isinstance(api, str):
        raise TokenConfigError(f"{where}.exact_counting_api must be a string")
    if not isinstance(raw.get("encoder_params", {}) or {}, dict):
        raise TokenConfigError(f"{where}.encoder_params must be a mapping")
    return ModelOverride(pattern=str(pattern).lower(), family=family, encoding=values.get("encoding"),
                         margin=values.get("margin"), exact_counting=exact, exact_counting_api=api)


def parse_token_config(data: Any) -> TokenConfig:
    """Validate a parsed YAML document; raises TokenConfigError naming the bad entry.

    Two formats, which may be combined: ctxlens's `families:` / `models:`, and the design
    document's `encoders:` (model name or glob → model_family, encoding_name, safety_margin,
    use_exact_counting, exact_counting_api, encoder_params). `encoders:` entries are tried
    before `models:` ones; in each, the first matching pattern wins."""
    if data is None:
        return TokenConfig()
    if not isinstance(data, dict) or set(data) - {"families", "models", "encoders"}:
        raise TokenConfigError("the top level must be a mapping with only 'families', 'models' and 'encoders'")
    families = dict(BUILTIN_FAMILIES)
    raw_families = data.get("families") or {}
    if not isinstance(raw_families, dict):
        raise TokenConfigError("families must be a mapping of family name to settings")
    for name, raw in raw_families.items():
        values = _settings(f"families.{name}", raw, {"encoding", "margin", "context_window"})
        base = families.get(str(name).lower(), BUILTIN_FAMILIES[FALLBACK_FAMILY])
        families[str(name).lower()] = FamilySettings(
            values.get("encoding", base.encoding),
            values.get("margin", base.margin),
            values.get("context_window", base.context_window),
        )
    models: list[ModelOverride] = []
    raw_models = data.get("models") or {}
    if not isinstance(raw_models, dict):
        raise TokenConfigError("models must be a mapping of glob pattern to settings")
    for pattern, raw in raw_models.items():
        where = f"models[{pattern!r}]"
        values = _settings(where, raw, {"family", "encoding", "margin", "context_window"})
        family = values.get("family")
        if family is not None and (not isinstance(family, str) or family.lower() not in families):
            raise TokenConfigError(f"{where}.family {family!r} is neither built in nor defined under families")
        models.append(ModelOverride(
            pattern=str(pattern).lower(),
            family=family.lower() if family else None,
            encoding=values.get("encoding"),
            margin=values.get("margin"),
            context_window=values.get("context_window"),
        ))
    raw_encoders = data.get("encoders") or {}
    if not isinstance(raw_encoders, dict):
        raise TokenConfigError("encoders must be a mapping of model name or glob pattern to encoder settings")
    seeded = [_seed_encoder(pattern, raw, families) for pattern, raw in raw_encoders.items()]
    return TokenConfig(MappingProxyType(families), (*seeded, *models))


def load_token_config(path: Path) -> TokenConfig:
    """Read and validate the YAML file; a missing file means the built-in defaults."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return TokenConfig()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenConfigError(f"cannot be read ({type(exc).__name__})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise TokenConfigError(f"not valid YAML{where}") from None
    return parse_token_config(data)


# ---- model names ----------------------------------------------------------------------------

def detect_model(name: str) -> tuple[str, str]:
    """(family, model id) for a lower-cased name; provider prefixes and tags are skipped.

    The name is split on "/" and ":" ("openrouter/meta-llama/llama-3.1-70b", "openai:gpt-4o",
    "llama3.1:8b"); segments are tried right to left and the id starts at the family keyword
    ("us.anthropic.claude-3-5-sonnet-v2:0" → claude, "claude-3-5-sonnet-v2").
    """
    segments = [s for s in re.split(r"[/:]", name) if s]
    for segment in reversed(segments):
        match = _FAMILY_RE.search(segment)
        if match:
            return match.lastgroup or FALLBACK_FAMILY, segment[match.start():]
    return FALLBACK_FAMILY, segments[-1] if segments else ""


def builtin_window(family: str, model_id: str) -> int | None:
    """The documented context window of a known model, or None to use the family's."""
    return next((w for f, pattern, w in _MODEL_WINDOWS if f == family and pattern.search(model_id)), None)
