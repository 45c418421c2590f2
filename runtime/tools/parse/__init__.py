"""Reading a reply's tool calls, whole or as a streamed prefix: JSON that may be cut (`partial_json.py`), the
reader's primitives (`reader.py`), one reader per shape (`json_calls.py`, `xml_calls.py`, `python_calls.py`,
`gemma_calls.py`, `harmony_calls.py`) and the one scanner that walks content and calls (`scan.py`).
"""

from runtime.tools.parse.reader import RawCall
from runtime.tools.parse.scan import Scanned, scan

__all__ = ["RawCall", "Scanned", "scan"]
