"""STUB for the third-party `regex` module (Debian: python3-regex, often not
installed): vLLM's fs tier imports it for a few patterns the standard `re`
module handles the same way."""

import re as _re

compile = _re.compile
error = _re.error
escape = _re.escape
match = _re.match
search = _re.search
sub = _re.sub
IGNORECASE = _re.IGNORECASE
__all__ = ["compile", "error", "escape", "match", "search", "sub", "IGNORECASE"]
