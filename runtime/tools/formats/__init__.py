"""The tool-call formats: the interface (`base.py`: `ToolFormat`, `RenderPlan`), the native one made from a
family's `ToolSyntax` (`native.py`: `SyntaxFormat`, `HermesFormat`), Llama 3.x's (`llama3.py`), llama-server's
generic one for templates that render no tools (`generic.py`), which one a template speaks (`detect.py`), and
whether a stored reply renders back to the generated text (`reconstruct.py`).
"""

from runtime.tools.formats.base import RenderPlan, ToolFormat
from runtime.tools.formats.detect import detect_format, render_prompt, template_uses_tools
from runtime.tools.formats.generic import GenericFormat
from runtime.tools.formats.llama3 import Llama3Format
from runtime.tools.formats.native import HermesFormat, SyntaxFormat

__all__ = [
    "GenericFormat",
    "HermesFormat",
    "Llama3Format",
    "RenderPlan",
    "SyntaxFormat",
    "ToolFormat",
    "detect_format",
    "render_prompt",
    "template_uses_tools",
]
