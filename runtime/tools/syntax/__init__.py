"""The tool-call syntaxes as data: `ToolSyntax` and its shapes, one class each (`shapes.py`), the families llama-server
parses, in detection order (`families.py`). Nothing here reads or writes a reply: `runtime.tools.parse`
reads one, `runtime.tools.grammar` constrains one, both by the shape's type.
"""

from runtime.tools.syntax.families import FAMILIES, HERMES, by_name, detect_syntax
from runtime.tools.syntax.shapes import Shape, ToolSyntax

__all__ = ["FAMILIES", "HERMES", "Shape", "ToolSyntax", "by_name", "detect_syntax"]
