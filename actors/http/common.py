"""What the app's own routes and its parts share: the longest search text a GET
takes, and the answer to a change of a memory (:class:`Changed`).
"""

from __future__ import annotations

from pydantic import BaseModel

# The longest search text a GET takes in its query string (recall, the words
# filter): a question, not a document; longer texts go in a POST body. Bounds
# the request line (at most 12 bytes a character, percent-encoded) well under
# the server's limit for a request's head (actors/http/server.py, MAX_HEAD_BYTES).
MAX_QUERY_CHARS = 2000


class Changed(BaseModel):
    ref: str
    change: str
    detail: str
