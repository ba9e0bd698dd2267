"""Chat templates: render a conversation into the prompt text the model was trained on.

Templates are the Jinja sources HF ships in tokenizer_config.json (copied by llama.cpp into
`tokenizer.chat_template`). We render them like transformers' `apply_chat_template`: sandboxed
environment, trim_blocks/lstrip_blocks, `raise_exception`, a `tojson` that keeps non-ASCII,
`strftime_now`, loop controls and `{% generation %}` blocks; messages get the same clean-up
(None-valued keys dropped, reasoning fields aliased) plus two for API clients:

* `content: None` (OpenAI assistant tool-call turns) becomes "" instead of being dropped, so
  templates that string-process content do not fail;
* tool-call `arguments` sent as a JSON string become a dict when the template treats them as a
  mapping (`arguments | tojson`, `| items`, `.items()`, `is mapping`), so it renders the
  canonical JSON the model was trained on instead of the client's spacing.

Defaults when a GGUF has no template (DEFAULT_TEMPLATES, files in strata/text/templates/):
gemma* architectures -> gemma3.jinja (`<start_of_turn>user ... <end_of_turn>`), anything else
-> chatml.jinja (`<|im_start|>role ... <|im_end|>`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from importlib import resources
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from strata.errors import TemplateError
from strata.gguf.reader import GGUFFile

#: architecture prefix -> default template file, for GGUFs without tokenizer.chat_template.
DEFAULT_TEMPLATES: dict[str, str] = {"gemma": "gemma3.jinja"}
FALLBACK_TEMPLATE = "chatml.jinja"

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# `x.arguments | tojson`, `x['arguments']|items`, `arguments.items()`, `arguments is mapping`
_MAPPING_ARGS = re.compile(
    r"""arguments['"]?\]?\s*(?:\|\s*(?:tojson|items|dictsort)|\.\s*items\s*\(|is\s+mapping)"""
)


class _RaisedByTemplate(jinja2.TemplateError):
    """What the template's own raise_exception() throws; surfaces with its message unchanged."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker): renders its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """namespace() that refuses underscore attributes (the sandbox escape HF also blocks)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's built-in tojson HTML-escapes and forces ASCII; HF templates expect plain json.dumps.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = lambda *a, **kw: dict(*a, **kw)  # not the type itself: no attribute hacks
    return env


_ENV = _environment()


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(
        self, source: str, bos_token: str = "", eos_token: str = "", variants: Mapping[str, str] | None = None
    ) -> None:
        """`source` is the default template; `variants` are named alternates (e.g. "tool_use")."""
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._compiled = _compile(source)
        self._variants = {name: (src, _compile(src)) for name, src in (variants or {}).items()}

    @classmethod
    def from_gguf(cls, gguf_file: GGUFFile, tokenizer: Any) -> ChatTemplate:
        """The GGUF's `tokenizer.chat_template` (plus named `tokenizer.chat_template.<name>`
        variants), else the architecture default (see DEFAULT_TEMPLATES)."""
        meta = gguf_file.metadata
        source = meta.get("tokenizer.chat_template")
        variants = {
            key.rsplit(".", 1)[1]: str(val)
            for key, val in meta.items()
            if key.startswith("tokenizer.chat_template.") and isinstance(val, str)
        }
        if not source:
            source = load_default_template(gguf_file.architecture)
        return cls(str(source), tokenizer.bos_token, tokenizer.eos_token, variants)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text. kwargs reach the template as variables (enable_thinking, documents, ...)."""
        source, compiled = self.source, self._compiled
        if tools is not None and "tool_use" in self._variants:  # as HF: tools given -> tool_use variant
            source, compiled = self._variants["tool_use"]
        mapping_args = bool(_MAPPING_ARGS.search(source))
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, "documents": None}
        context.update(_plain(kwargs))
        try:
            msgs = [_normalize_message(m, mapping_args) for m in messages]
            return compiled.render(
                messages=msgs,
                tools=_plain(list(tools)) if tools is not None else None,
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except _RaisedByTemplate as e:
            raise TemplateError(str(e)) from None
        except TemplateError:
            raise
        except Exception as e:  # template bugs surface as whatever Python raised inside them
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e


def load_default_template(architecture: str) -> str:
    """Source of the default template for an architecture (DEFAULT_TEMPLATES, else ChatML)."""
    name = next(
        (f for prefix, f in DEFAULT_TEMPLATES.items() if architecture.startswith(prefix)), FALLBACK_TEMPLATE
    )
    return resources.files("strata.text").joinpath("templates", name).read_text(encoding="utf-8")


def _compile(source: str) -> jinja2.Template:
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not parse (line {e.lineno}): {e.message}") from None


def _plain(value: Any) -> Any:
    """A fresh copy made of JSON types only: the sandbox then never sees caller objects, and the
    caller's messages are never modified."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if callable(getattr(value, "model_dump", None)):  # pydantic models from the API layer
        return _plain(value.model_dump())
    for base in (bool, int, float, str):  # enums, numpy scalars, str subclasses
        if isinstance(value, base):
            return base(value)
    if hasattr(value, "item"):
        return _plain(value.item())
    return f"<{type(value).__name__}>"


def _normalize_message(message: Mapping[str, Any], mapping_args: bool) -> dict[str, Any]:
    msg = _plain(message)
    if not isinstance(msg, dict):
        raise TemplateError(f"chat messages must be objects, got {type(message).__name__}")
    if "content" in msg and msg["content"] is None:
        msg["content"] = ""
    msg = {k: v for k, v in msg.items() if v is not None}
    reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
    if reasoning is not None:
        msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
    if mapping_args and isinstance(msg.get("tool_calls"), list):
        for call in msg["tool_calls"]:
            if not isinstance(call, dict):
                continue
            target = call["function"] if isinstance(call.get("function"), dict) else call
            args = target.get("arguments")
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    continue  # not JSON: leave it for the template's string branch
                if isinstance(parsed, dict):
                    target["arguments"] = parsed
    return msg
