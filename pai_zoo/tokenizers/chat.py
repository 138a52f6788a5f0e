"""Chat templates rendered the way transformers' ``apply_chat_template(tokenize=False)`` renders them (sandboxed
Jinja, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``strftime_now``, ``{% generation %}``). Jinja is
imported when a template is first compiled."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ..plugin.errors import TokenizerError

__all__ = ["render_chat_template"]


def render_chat_template(source: str, messages: list[dict], add_generation_prompt: bool, variables: dict) -> str:
    """``source`` rendered for ``messages``; ``variables`` (special tokens, extra keyword arguments) become template
    variables beside ``tools=None`` and ``documents=None``."""
    template = _compile_chat_template(source)
    merged: dict[str, Any] = {"tools": None, "documents": None}
    merged.update(variables)
    return template.render(
        messages=_normalize_messages(messages), add_generation_prompt=add_generation_prompt, **merged
    )


def _normalize_messages(messages: list[dict]) -> list[dict]:
    """Drop ``None`` values and alias reasoning fields, as transformers does before rendering."""
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TokenizerError(f"chat message {index} is a {type(message).__name__}, not a dict: {message!r}; "
                                 'give each message as {"role": ..., "content": ...}')
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in ("reasoning_content", "thinking", "reasoning") if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


_TEMPLATE_CACHE: dict[str, Any] = {}


def _compile_chat_template(source: str):
    """Compile a chat template in an environment like transformers' ``_compile_jinja_template``."""
    cached = _TEMPLATE_CACHE.get(source)
    if cached is not None:
        return cached
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(jinja2.ext.Extension):
        # ``{% generation %}...{% endgeneration %}`` marks assistant text for masks; here it renders its body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    compiled = env.from_string(source)
    _TEMPLATE_CACHE[source] = compiled
    return compiled

