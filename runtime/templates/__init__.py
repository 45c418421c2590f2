"""Chat templates rendered as llama-server renders them (pure: jinja2 only, importable from the event loop).

    prompt = apply_template(source, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)

`apply_template` equals llama-server's `POST /apply-template` for the same template, messages, tools and
template variables (tests/templates/test_template_parity.py checks every template llama.cpp keeps); `template_caps`
is llama.cpp's view of what a template supports; `CHATML_TEMPLATE` its fallback.
"""

from runtime.templates.apply import CHATML_TEMPLATE, apply_template, default_enable_thinking
from runtime.templates.caps import TemplateCaps, template_caps

__all__ = ["CHATML_TEMPLATE", "TemplateCaps", "apply_template", "default_enable_thinking", "template_caps"]
