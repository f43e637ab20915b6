"""The HTTP server: one actor (``server``) serving one app (``app``).

``backend`` is how the app reaches the other actors; one module per way in:
``openai`` (chat completions), ``ollama`` (Ollama's API), ``mcp`` (the MCP
server), ``memories`` (the REST memory API) and ``page`` (the memory page).
``common`` holds what the app's own routes and ``memories`` share (the longest
GET search text, the ``Changed`` answer).
"""
