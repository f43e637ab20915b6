"""OAuth 2.0 for ``/mcp``, as Home Assistant's MCP client performs it.

Home Assistant's MCP integration has no field for a static bearer token: it
connects without authentication or through OAuth 2.0. So ``/mcp`` is also an
OAuth-protected resource, and Reverie its own authorization server:

* a 401 on ``/mcp`` carries ``WWW-Authenticate: Bearer error="invalid_token",
  resource_metadata="<base>/.well-known/oauth-protected-resource/mcp"`` (RFC
  9728); the metadata is served there and at
  ``/.well-known/oauth-protected-resource``; the authorization server's at
  ``/.well-known/oauth-authorization-server`` (RFC 8414);
* ``POST /register``: dynamic client registration (RFC 7591; a confidential
  client, its secret never expires: Home Assistant refuses one that does);
* ``GET /authorize``: the authorization-code grant with PKCE (S256 only). It
  sends the browser to the approval page, ``/oauth/approve``, behind the memory
  page's login: the person sees the client's name, its redirect URI and what it
  gets, says who they are (whose sensitive memories it may read) and approves
  or denies (a POST form with the page's CSRF token and same-origin check);
  approving redirects to the client's redirect URI with the code;
* ``POST /token``: the ``authorization_code`` and ``refresh_token`` grants;
* ``POST /revoke``: revocation (RFC 7009) of an access or refresh token, and
  with it the whole grant.

The endpoints are the ``mcp`` SDK's own handlers (``mcp.server.auth``:
validation of every request, PKCE, client authentication, error shapes) over
:class:`Provider`, which implements the SDK's
``OAuthAuthorizationServerProvider`` on :class:`OAuthStore`. The SDK is loaded
on the first request to one of these paths, as for ``/mcp``.

The issuer and resource URLs are the request's own scheme and ``Host``: the
hub is reached by its LAN address, whatever it is. Under a path (a household's
``/households/ID``: the ASGI ``root_path``) the issuer is that path: its
metadata is at the path-inserted well-known URLs (RFC 8414 §3.1, RFC 9728
§3.1), which the household routing sends to the household's app.

What is kept (:class:`OAuthStore`, ``<data dir>/mcp-oauth.json``, 0600,
rewritten whole on each change through ``write_private``): the registered
clients (their metadata and client secret: the secret alone grants nothing)
and, for each issued token, its SHA-256 only, never the token itself, with
its client, expiry, grant and the person who approved it. Authorization codes
(5 minutes, single use) and pending approvals (10 minutes) live in memory
only, the codes hashed too. Access tokens last ``http.mcp_access_token_seconds``
(1 hour), refresh tokens ``http.mcp_refresh_token_seconds`` (30 days); a
refresh rotates both and voids the old ones. Time comes from the injected
clock.

Who the caller is: the admin bearer token (``<data dir>/http-token``) sees
everything, as before. An OAuth client is bound to the audience its approver
chose: one of ``household.people`` (their own sensitive memories and the
household's) or the household as a whole (the household's sensitive memories,
no person's), by :func:`runtime.memories.privacy.may_use` on a typed channel.
The Guard leaves it in the request's scope under :data:`AUDIENCE_KEY`.

Nothing here logs a token, a code, a secret or memory content.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from runtime.config import Settings
from runtime.memories.privacy import Audience, clean_person, known_people, person_key
from runtime.store.files import write_private
from runtime.time.clock import Clock, SystemClock

if TYPE_CHECKING:
    from mcp.server.auth.provider import (
        AccessToken,
        AuthorizationCode,
        AuthorizationParams,
        RefreshToken,
    )
    from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

log = logging.getLogger(__name__)

STORE_FILE = "mcp-oauth.json"
AUDIENCE_KEY = "reverie.audience"     # scope key: the OAuth caller's Audience (admin: absent)
OAUTH_KEY = "reverie.oauth"           # scope key: the OAuthServer, for the approval page
SCOPE = "memory"                      # the one scope: the MCP tools
POST_AUTH = "client_secret_post"      # the one client authentication at /token and /revoke
CODE_S = 300                          # an authorization code's life
PENDING_S = 600                       # how long an approval may wait
MAX_PENDING = 64
MAX_CLIENTS = 100
UNUSED_CLIENT_S = 3600                # a client never approved is dropped after this when full
APPROVE_PATH = "/oauth/approve"
PRM_PATH = "/.well-known/oauth-protected-resource"
AS_PATH = "/.well-known/oauth-authorization-server"
OPEN_PATHS = frozenset({PRM_PATH, PRM_PATH + "/mcp", AS_PATH, "/authorize", "/token",
                        "/register", "/revoke"})


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def audience_of(settings: Settings, person: str | None) -> Audience:
    """An OAuth client's audience: its approver, on a typed channel."""
    key = person_key(person)
    return Audience(speaker=key, known=key is not None and key in known_people(settings),
                    spoken=False)


@dataclass
class Pending:
    client_id: str
    client_name: str
    redirect_uri: str
    redirect_uri_explicit: bool
    code_challenge: str
    state: str | None
    scopes: list[str]
    resource: str | None
    created: float


@dataclass
class Code:
    client_id: str
    redirect_uri: str
    redirect_uri_explicit: bool
    code_challenge: str
    scopes: list[str]
    resource: str | None
    person: str | None
    expires_at: float


@dataclass
class Grant:
    """What a token hash maps to."""

    kind: str             # "access" or "refresh"
    client_id: str
    grant: str            # the approval it comes from: revoking one token revokes all of it
    scopes: list[str]
    expires_at: float
    person: str | None
    resource: str | None = None

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Issued:
    access: str
    refresh: str
    expires_in: int
    scopes: list[str]


@dataclass
class _Data:
    clients: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens: dict[str, Grant] = field(default_factory=dict)


class OAuthStore:
    """Clients and token hashes, in ``<data dir>/mcp-oauth.json`` (0600); codes
    and pending approvals in memory. Thread-safe (one lock)."""

    def __init__(self, path: Path, clock: Clock, access_s: int, refresh_s: int) -> None:
        self.path = path
        self.clock = clock
        self.access_s = access_s
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}
        self._codes: dict[str, Code] = {}
        self._data = self._load()

    def _load(self) -> _Data:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return _Data()
        except (OSError, ValueError) as exc:
            # never lose it silently: a broken file is kept aside, and nobody is let in
            aside = self.path.with_suffix(".broken")
            log.warning("oauth: %s could not be read (%s); kept as %s, starting empty",
                        self.path.name, type(exc).__name__, aside.name)
            self.path.replace(aside)
            return _Data()
        tokens = {h: Grant(**g) for h, g in raw.get("tokens", {}).items()}
        return _Data(clients=dict(raw.get("clients", {})), tokens=tokens)

    def _save(self) -> None:
        now = self.clock.now()
        self._data.tokens = {h: g for h, g in self._data.tokens.items() if g.expires_at > now}
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(self.path, json.dumps({
            "clients": self._data.clients,
            "tokens": {h: g.as_json() for h, g in self._data.tokens.items()},
        }, indent=1, sort_keys=True) + "\n")

    # -- clients

    def client(self, client_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._data.clients.get(client_id)
            return dict(found) if found is not None else None

    def add_client(self, client_id: str, info: dict[str, Any]) -> bool:
        """Keep a registered client; False when there are too many."""
        with self._lock:
            clients = self._data.clients
            if len(clients) >= MAX_CLIENTS:
                now = self.clock.now()
                used = {g.client_id for g in self._data.tokens.values()}
                for cid in [c for c, i in clients.items()
                            if c not in used and now - i.get("registered_at", 0) > UNUSED_CLIENT_S]:
                    del clients[cid]
            if len(clients) >= MAX_CLIENTS:
                return False
            clients[client_id] = {**info, "registered_at": self.clock.now()}
            self._save()
            return True

    def grants(self) -> list[tuple[str, str, str | None, float]]:
        """The live approvals: (grant, client name, person, latest expiry)."""
        with self._lock:
            now = self.clock.now()
            out: dict[str, tuple[str, str, str | None, float]] = {}
            for g in self._data.tokens.values():
                if g.expires_at <= now:
                    continue
                name = self._data.clients.get(g.client_id, {}).get("client_name") or g.client_id
                seen = out.get(g.grant)
                out[g.grant] = (g.grant, name, g.person,
                                max(g.expires_at, seen[3] if seen else 0.0))
            return sorted(out.values(), key=lambda t: t[1])

    # -- approvals and codes

    def pend(self, pending: Pending) -> str:
        with self._lock:
            now = self.clock.now()
            for key in [k for k, p in self._pending.items() if now - p.created > PENDING_S]:
                del self._pending[key]
            while len(self._pending) >= MAX_PENDING:
                del self._pending[next(iter(self._pending))]
            key = secrets.token_urlsafe(24)
            self._pending[key] = pending
            return key

    def pending(self, key: str) -> Pending | None:
        with self._lock:
            found = self._pending.get(key)
            if found is None or self.clock.now() - found.created > PENDING_S:
                return None
            return found

    def decide(self, key: str) -> Pending | None:
        """Take a pending approval (once)."""
        with self._lock:
            found = self._pending.pop(key, None)
            if found is None or self.clock.now() - found.created > PENDING_S:
                return None
            return found

    def new_code(self, pending: Pending, person: str | None) -> str:
        code = secrets.token_urlsafe(32)
        with self._lock:
            now = self.clock.now()
            for key in [k for k, c in self._codes.items() if c.expires_at <= now]:
                del self._codes[key]
            self._codes[digest(code)] = Code(
                pending.client_id, pending.redirect_uri, pending.redirect_uri_explicit,
                pending.code_challenge, pending.scopes, pending.resource,
                clean_person(person), now + CODE_S)
        return code

    def code(self, client_id: str, code: str) -> Code | None:
        with self._lock:
            found = self._codes.get(digest(code))
            if (found is None or found.client_id != client_id
                    or found.expires_at <= self.clock.now()):
                return None
            return found

    def use_code(self, code: str) -> Code | None:
        with self._lock:
            return self._codes.pop(digest(code), None)

    # -- tokens

    def issue(self, client_id: str, scopes: list[str], person: str | None,
              resource: str | None, grant: str | None = None) -> Issued:
        access, refresh = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._lock:
            now = self.clock.now()
            grant = grant or secrets.token_hex(8)
            self._data.tokens[digest(access)] = Grant("access", client_id, grant, scopes,
                                                      now + self.access_s, person, resource)
            self._data.tokens[digest(refresh)] = Grant("refresh", client_id, grant, scopes,
                                                       now + self.refresh_s, person, resource)
            self._save()
        return Issued(access, refresh, self.access_s, scopes)

    def token(self, token: str, kind: str) -> Grant | None:
        """The live grant of a token of this kind, or None."""
        with self._lock:
            found = self._data.tokens.get(digest(token))
            if found is None or found.kind != kind or found.expires_at <= self.clock.now():
                return None
            return found

    def rotate(self, refresh: str) -> Issued | None:
        """A refresh: the old grant's tokens void, new ones issued."""
        with self._lock:
            old = self._data.tokens.get(digest(refresh))
            if old is None or old.kind != "refresh" or old.expires_at <= self.clock.now():
                return None
            self._drop(old.grant)
        return self.issue(old.client_id, old.scopes, old.person, old.resource, old.grant)

    def revoke(self, token_or_grant: str, *, grant: bool = False) -> bool:
        with self._lock:
            if grant:
                key = token_or_grant
            else:
                found = self._data.tokens.get(digest(token_or_grant))
                if found is None:
                    return False
                key = found.grant
            dropped = self._drop(key)
            if dropped:
                self._save()
            return dropped

    def _drop(self, grant: str) -> bool:
        tokens = self._data.tokens
        gone = [h for h, g in tokens.items() if g.grant == grant]
        for h in gone:
            del tokens[h]
        return bool(gone)


# -- the SDK's provider protocol over the store ----------------------------------------

class Provider:
    """``mcp.server.auth.provider.OAuthAuthorizationServerProvider`` over
    :class:`OAuthStore` (structural: the SDK is imported inside the methods)."""

    def __init__(self, store: OAuthStore) -> None:
        self.store = store

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        from mcp.shared.auth import OAuthClientInformationFull

        info = self.store.client(client_id)
        if info is None:
            return None
        info.pop("registered_at", None)
        return OAuthClientInformationFull.model_validate(info)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        from mcp.server.auth.provider import RegistrationError

        if client_info.client_id is None:
            raise RegistrationError("invalid_client_metadata", "no client_id")
        if client_info.token_endpoint_auth_method == "client_secret_basic":
            # RFC 7591 §3.2.1: the server may replace a requested value; the
            # answer tells the client (see _only_post_metadata)
            client_info.token_endpoint_auth_method = POST_AUTH
        if client_info.token_endpoint_auth_method == "none" or not client_info.client_secret:
            # public clients are not served: the secret binds the code to the client
            raise RegistrationError("invalid_client_metadata",
                                    "token_endpoint_auth_method must be client_secret_post "
                                    "or client_secret_basic")
        if not self.store.add_client(client_info.client_id,
                                     client_info.model_dump(mode="json", exclude_none=True)):
            raise RegistrationError("invalid_client_metadata",
                                    "too many registered clients; try again later")
        log.info("oauth: client registered")

    async def authorize(self, client: OAuthClientInformationFull,
                        params: AuthorizationParams) -> str:
        key = self.store.pend(Pending(
            client_id=client.client_id or "", client_name=client.client_name or "",
            redirect_uri=str(params.redirect_uri),
            redirect_uri_explicit=params.redirect_uri_provided_explicitly,
            code_challenge=params.code_challenge, state=params.state,
            scopes=params.scopes or [SCOPE], resource=params.resource,
            created=self.store.clock.now()))
        return f"{APPROVE_PATH}?{urlencode({'request': key})}"

    async def load_authorization_code(self, client: OAuthClientInformationFull,
                                      authorization_code: str) -> AuthorizationCode | None:
        from mcp.server.auth.provider import AuthorizationCode

        found = self.store.code(client.client_id or "", authorization_code)
        if found is None:
            return None
        return AuthorizationCode(
            code=authorization_code, scopes=found.scopes, expires_at=found.expires_at,
            client_id=found.client_id, code_challenge=found.code_challenge,
            redirect_uri=found.redirect_uri,  # type: ignore[arg-type]
            redirect_uri_provided_explicitly=found.redirect_uri_explicit,
            resource=found.resource, subject=found.person)

    async def exchange_authorization_code(self, client: OAuthClientInformationFull,
                                          authorization_code: AuthorizationCode) -> OAuthToken:
        from mcp.server.auth.provider import TokenError

        found = self.store.use_code(authorization_code.code)
        if found is None:
            raise TokenError("invalid_grant", "authorization code already used or expired")
        issued = self.store.issue(found.client_id, found.scopes, found.person, found.resource)
        log.info("oauth: tokens issued for an approved client")
        return _token(issued)

    async def load_refresh_token(self, client: OAuthClientInformationFull,
                                 refresh_token: str) -> RefreshToken | None:
        from mcp.server.auth.provider import RefreshToken

        found = self.store.token(refresh_token, "refresh")
        if found is None or found.client_id != client.client_id:
            return None
        return RefreshToken(token=refresh_token, client_id=found.client_id,
                            scopes=found.scopes, expires_at=int(found.expires_at),
                            resource=found.resource, subject=found.person)

    async def exchange_refresh_token(self, client: OAuthClientInformationFull,
                                     refresh_token: RefreshToken,
                                     scopes: list[str]) -> OAuthToken:
        from mcp.server.auth.provider import TokenError

        issued = self.store.rotate(refresh_token.token)
        if issued is None:
            raise TokenError("invalid_grant", "refresh token expired or revoked")
        return _token(issued)

    async def load_access_token(self, token: str) -> AccessToken | None:
        from mcp.server.auth.provider import AccessToken

        found = self.store.token(token, "access")
        if found is None:
            return None
        return AccessToken(token=token, client_id=found.client_id, scopes=found.scopes,
                           expires_at=int(found.expires_at), resource=found.resource,
                           subject=found.person)

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        if self.store.revoke(token.token):
            log.info("oauth: a grant was revoked")

    async def exchange_identity_assertion(self, client: Any, params: Any) -> OAuthToken:
        from mcp.server.auth.provider import TokenError

        raise TokenError("unsupported_grant_type", "the JWT bearer grant is not supported")


def _token(issued: Issued) -> OAuthToken:
    from mcp.shared.auth import OAuthToken

    return OAuthToken(access_token=issued.access, token_type="Bearer",
                      expires_in=issued.expires_in, scope=" ".join(issued.scopes),
                      refresh_token=issued.refresh)


# -- the server: the Guard's questions, the SDK's endpoints -----------------------------

_HOST = re.compile(r"(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")


def origin(scope: dict[str, Any]) -> str:
    """``scheme://host[:port]`` as the client reached us (the ``Host`` header;
    one that is not a plain host and port: the address the server listens on)."""
    headers = dict(scope.get("headers") or [])
    host = headers.get(b"host", b"").decode("latin-1").strip()
    if not _HOST.fullmatch(host):
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"[{server[0]}]:{server[1]}" if ":" in str(server[0]) else \
            f"{server[0]}:{server[1]}"
    scheme = "https" if scope.get("scheme") == "https" else "http"
    return f"{scheme}://{host}"


def base_url(scope: dict[str, Any]) -> str:
    """The app's own URL: :func:`origin` and the path it is served under (a
    household's ``/households/ID``; the hub's: none). The issuer, and the
    base of every endpoint and of the resource."""
    return origin(scope) + str(scope.get("root_path") or "")


class OAuthServer:
    """What the Guard asks (is the path open, whose is this token, the 401's
    header) and the ASGI app serving the SDK's handlers on :data:`OPEN_PATHS`."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.store = OAuthStore(settings.store.resolved_dir / STORE_FILE,
                                clock or SystemClock(),
                                settings.http.mcp_access_token_seconds,
                                settings.http.mcp_refresh_token_seconds)
        self.provider = Provider(self.store)
        self._handlers: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def is_open_path(path: str) -> bool:
        return path in OPEN_PATHS

    def audience(self, token: str) -> Audience | None:
        """The audience of a live access token, or None."""
        found = self.store.token(token, "access")
        return None if found is None else audience_of(self.settings, found.person)

    def challenge(self, scope: dict[str, Any]) -> str:
        """The ``WWW-Authenticate`` value of a 401 on ``/mcp`` (RFC 9728 §5.1):
        the metadata's well-known URL, the resource's path inserted after it
        (§3.1), as the household routing serves it
        (:mod:`actors.http.households`)."""
        root = str(scope.get("root_path") or "")
        return (f'Bearer error="invalid_token", error_description="Authentication required", '
                f'resource_metadata="{origin(scope)}{PRM_PATH}{root}/mcp"')

    def _routes(self, base: str) -> dict[str, Any]:
        """The SDK's handlers for one base URL (built once per base)."""
        from mcp.server.auth.routes import create_protected_resource_routes
        from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
        from pydantic import AnyHttpUrl
        from starlette.routing import Router

        issuer = AnyHttpUrl(base)
        registration = ClientRegistrationOptions(enabled=True, valid_scopes=[SCOPE],
                                                 default_scopes=[SCOPE])
        revocation = RevocationOptions(enabled=True)
        routes = [_only_post_metadata(r, issuer, registration, revocation)
                  if getattr(r, "path", "") == AS_PATH else r
                  for r in _auth_routes(self.provider, issuer, registration, revocation)]
        resource = AnyHttpUrl(base + "/mcp")
        # served at this app's own paths (the SDK's route would take the path
        # the app is served under too): the resource's, and the bare form for
        # clients that ask the root first
        metadata = create_protected_resource_routes(resource, [issuer], [SCOPE],
                                                    "Reverie memory")
        routes += [_renamed(r, path) for r in metadata for path in (PRM_PATH + "/mcp", PRM_PATH)]
        return {"router": Router(routes=routes)}

    def _router(self, base: str) -> Any:
        with self._lock:
            built = self._handlers.get((base, "router"))
            if built is None:
                built = self._routes(base)["router"]
                if len(self._handlers) > 16:  # a client sending many Host values
                    self._handlers.clear()
                self._handlers[(base, "router")] = built
            return built

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import anyio

        router = await anyio.to_thread.run_sync(self._router, base_url(scope))
        await router(scope, receive, send)


def _auth_routes(provider: Any, issuer: Any, registration: Any, revocation: Any) -> list[Any]:
    """``mcp.server.auth.routes.create_auth_routes`` without its https-only issuer
    check (the rest of its checks kept)."""
    import mcp.server.auth.routes as sdk_routes

    original = sdk_routes.validate_issuer_url

    def validate(url: Any) -> None:
        if url.fragment or url.query:
            original(url)

    # the function reads the module global; swap it for this one call only
    with _SWAP_LOCK:
        sdk_routes.validate_issuer_url = validate
        try:
            return list(sdk_routes.create_auth_routes(provider, issuer, None, registration,
                                                      revocation))
        finally:
            sdk_routes.validate_issuer_url = original


_SWAP_LOCK = threading.Lock()


def _only_post_metadata(route: Any, issuer: Any, registration: Any, revocation: Any) -> Any:
    """The RFC 8414 metadata with ``client_secret_post`` as the one client
    authentication: Home Assistant's OAuth2 implementation sends the client's
    secret in the form body, and the SDK's authenticator, for a client
    registered as ``client_secret_basic``, wants it in a Basic header only."""
    from mcp.server.auth.handlers.metadata import MetadataHandler
    from mcp.server.auth.routes import build_metadata, cors_middleware
    from starlette.routing import Route

    metadata = build_metadata(issuer, None, registration, revocation)
    metadata.token_endpoint_auth_methods_supported = [POST_AUTH]
    metadata.revocation_endpoint_auth_methods_supported = [POST_AUTH]
    return Route(route.path, endpoint=cors_middleware(MetadataHandler(metadata).handle,
                                                      ["GET", "OPTIONS"]),
                 methods=["GET", "OPTIONS"])


def _renamed(route: Any, path: str) -> Any:
    from starlette.routing import Route

    return Route(path, endpoint=route.endpoint, methods=list(route.methods or ["GET"]))
