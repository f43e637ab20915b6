"""The OAuth client's side for the MCP tests: the SDK's token storage, in
memory, and reading a field of the approval page."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from mcp.shared.auth import OAuthClientInformationFull, OAuthToken


@dataclass
class Memory:
    """The SDK's TokenStorage, in memory."""

    tokens: OAuthToken | None = None
    client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def field_of(page: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found, f"no {name} field in the page"
    return html.unescape(found.group(1))

