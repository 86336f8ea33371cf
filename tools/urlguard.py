"""URL safety for page access: refuse anything that is not a public http(s) address.

An agent chooses the URLs it fetches, so a fetch tool is a server-side request forgery (SSRF)
channel into whatever network the trainer runs in: cloud metadata services, the Ray dashboard,
the inference servers. The guard refuses, for IPv4 and IPv6 alike:

- schemes other than http/https, and URLs that carry credentials (`user:pw@host`);
- host names that are private by definition (`localhost`, `*.localhost`, `*.internal`,
  `metadata.google.internal`, ...);
- every address that is not globally routable: private, loopback, link-local, multicast,
  reserved, unspecified, shared/CGNAT (100.64/10), documentation and benchmarking ranges
  (anything `ipaddress` does not call `is_global`), plus named cloud-metadata addresses that
  are otherwise public (Azure's 168.63.129.16, Oracle's 192.0.0.192, ...);
- IPv4 hidden inside IPv6: mapped (`::ffff:a.b.c.d`), compatible (`::a.b.c.d`), translated
  (`::ffff:0:a.b.c.d`), 6to4 (`2002::/16`), Teredo (`2001::/32`) and NAT64 (`64:ff9b::/96`,
  `64:ff9b:1::/48`) — the embedded address is checked too;
- IPv4 literals in any spelling `inet_aton` accepts (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`).

**DNS rebinding.** Checking a name and then letting the HTTP client resolve it again is a
time-of-check/time-of-use hole: the second answer can be 127.0.0.1. `GuardedNetworkBackend`
closes it by doing the resolution itself at connect time, checking every address the name
resolves to (refusing the name if *any* is forbidden), connecting to exactly the checked
address, and re-checking the socket's peer address after connecting. TLS still verifies the
certificate against the original host name (SNI), so pinning the IP does not weaken HTTPS.
Every redirect hop is a new connection and therefore goes through the same check; `check_url`
additionally refuses bad schemes, credentials and literal addresses before any connection.

Only ports 80 and 443 are fetched (`ports`): a model-chosen URL must not reach a database or an
admin port on a public host.

An explicit allowlist (host names, `*.suffix` wildcards, IPs or CIDRs) overrides the address and port
checks — never the scheme and credential checks. Tests use it for the loopback fixture server.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

ALLOWED_SCHEMES = ("http", "https")

BLOCKED_HOSTNAMES = frozenset({
    "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback",
    "metadata", "metadata.google.internal", "metadata.goog", "metadata.azure.com",
    "instance-data", "instance-data.ec2.internal", "kubernetes", "kubernetes.default",
})
"""Names that always mean "this machine" or "the cloud control plane"."""

BLOCKED_SUFFIXES = (".localhost", ".internal", ".local", ".localdomain", ".home.arpa", ".svc", ".cluster.local")
"""Suffixes reserved for private networks (RFC 6761, RFC 8375, ICANN's .internal, Kubernetes)."""

METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS / GCP / Azure / OpenStack instance metadata
    "169.254.170.2",  # AWS ECS task metadata
    "169.254.169.253",  # AWS DNS resolver
    "fd00:ec2::254",  # AWS IMDS over IPv6
    "100.100.100.200",  # Alibaba Cloud metadata
    "168.63.129.16",  # Azure wire server (publicly routable address!)
    "192.0.0.192",  # Oracle Cloud metadata
))
"""Cloud metadata endpoints; some are public addresses, so they are listed explicitly."""

CGNAT = ipaddress.ip_network("100.64.0.0/10")
SPECIAL_PURPOSE = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
    "240.0.0.0/4", "100::/64", "2001::/23", "2001:db8::/32", "3fff::/20", "5f00::/16",
))
"""IANA special-purpose ranges refused regardless of how this Python version's `ipaddress` classifies them."""
NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
IPV4_COMPAT = ipaddress.ip_network("::/96")


class UrlRefused(Exception):
    """A URL or address the guard will not fetch. The message is one line and says why."""


class HostNotFound(Exception):
    """DNS says the name does not exist (permanent; a temporary DNS failure stays a network error)."""


RESERVED_TLDS = (".test", ".example", ".invalid")
"""RFC 2606 names that never exist on the public internet (the offline world lives on .test)."""


def parse_ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address `host` spells in any `inet_aton` form, or None when it is a name.

    `inet_aton` accepts 1-4 dot-separated parts, each decimal, octal (leading 0) or hex (0x);
    the last part fills the remaining bytes: `127.1` = 127.0.0.1, `2130706433` = 127.0.0.1.
    A host whose last label is numeric but which is not a valid address is refused (WHATWG
    URL rules), because resolvers disagree about what it means.
    """
    parts = host.split(".")
    if parts and parts[-1] == "":
        parts = parts[:-1]
    if not parts or not _is_number(parts[-1]):
        return None
    if len(parts) > 4 or not all(_is_number(p) for p in parts):
        raise UrlRefused(f"malformed IPv4 address '{host}'")
    values = [_number(p) for p in parts]
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        raise UrlRefused(f"malformed IPv4 address '{host}'")
    packed = 0
    for i, v in enumerate(head):
        packed |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(packed | last)


def _is_number(part: str) -> bool:
    p = part.lower()
    if p.startswith("0x"):
        return all(c in "0123456789abcdef" for c in p[2:])  # "0x" alone is 0, as in inet_aton
    return p.isdigit() and p.isascii()


def _number(part: str) -> int:
    p = part.lower()
    if p.startswith("0x"):
        return int(p[2:] or "0", 16)
    if len(p) > 1 and p.startswith("0"):
        if any(c in "89" for c in p):
            raise UrlRefused(f"malformed octal IPv4 part '{part}'")
        return int(p, 8)
    return int(p)


def parse_ip(host: str) -> IPAddress | None:
    """`host` as an IP address (IPv6 with or without brackets/zone id, IPv4 in any spelling), else None."""
    h = host.strip("[]")
    if ":" in h:
        try:
            return ipaddress.IPv6Address(h.split("%", 1)[0])
        except ValueError as e:
            raise UrlRefused(f"malformed IPv6 address '{host}'") from e
    return parse_ipv4_literal(h)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address carries (mapped, compatible, translated, 6to4, Teredo, NAT64)."""
    found: list[ipaddress.IPv4Address] = []
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip in IPV4_TRANSLATED or ip in NAT64_WELL_KNOWN or ip in NAT64_LOCAL:
        found.append(low32)
    if ip in IPV4_COMPAT and int(ip) > 1:
        found.append(low32)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why `ip` must not be fetched, or None when it is a public address."""
    if ip in METADATA_ADDRESSES:
        return "cloud metadata address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in NAT64_LOCAL:
            return "local-use NAT64 address"
        for inner in embedded_ipv4(ip):
            reason = forbidden_reason(inner)
            if reason:
                return f"{reason} {inner} embedded in IPv6"
    checks = (
        ("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
        ("private", ip.is_private), ("shared (CGNAT)", isinstance(ip, ipaddress.IPv4Address) and ip in CGNAT),
        ("reserved", ip.is_reserved),
        ("site-local", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
    )
    for name, hit in checks:
        if hit:
            return f"{name} address"
    if not ip.is_global or any(ip in net for net in SPECIAL_PURPOSE if net.version == ip.version):
        return "non-public special-purpose address"
    return None


async def system_resolver(host: str, port: int) -> list[str]:
    """All addresses the system resolver returns for `host` (A and AAAA), in its order."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for *_, sockaddr in infos:
        if sockaddr[0] not in seen:
            seen.append(sockaddr[0])
    return seen


class UrlGuard:
    """Decides which URLs and addresses page access may reach; see the module docstring."""

    def __init__(self, allow: Iterable[str] = (), resolver: Resolver | None = None,
                 ports: Iterable[int] = (80, 443)):
        self.ports = frozenset(ports)
        self.allow_names: set[str] = set()
        self.allow_suffixes: list[str] = []
        self.allow_networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for item in allow:
            self._add_allow(item.strip())
        self.resolver = resolver or system_resolver

    def _add_allow(self, item: str) -> None:
        if not item:
            return
        try:
            self.allow_networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
            return
        except ValueError:
            pass
        name = item.lower().rstrip(".")
        if name.startswith("*."):
            self.allow_suffixes.append(name[1:])
        else:
            self.allow_names.add(name)

    def host_allowed(self, host: str) -> bool:
        """True when the allowlist names this host (by name, wildcard suffix or address)."""
        h = host.lower().rstrip(".").strip("[]")
        if h in self.allow_names or any(h.endswith(s) for s in self.allow_suffixes):
            return True
        try:
            ip = parse_ip(h)
        except UrlRefused:
            return False
        return ip is not None and self.ip_allowed(ip)

    def ip_allowed(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self.allow_networks if net.version == ip.version)

    def check_ip(self, ip: IPAddress | str, host: str = "", resolved: bool = False) -> IPAddress:
        """Return `ip` when it may be contacted, else raise UrlRefused naming the reason.

        `host` is the name or literal the address came from (for the message); `resolved` says
        whether it came from DNS (the message then says "resolves to").
        """
        addr = ipaddress.ip_address(ip.split("%", 1)[0]) if isinstance(ip, str) else ip
        if self.ip_allowed(addr):
            return addr
        reason = forbidden_reason(addr)
        if reason:
            via = ""
            if host and host.strip("[]") != str(addr):
                via = f"'{host}' resolves to " if resolved else f"'{host}' = "
            raise UrlRefused(f"refused {via}{reason} {addr}")
        return addr

    def check_url(self, url: str | httpx.URL) -> httpx.URL:
        """Static checks before any connection: scheme, credentials, host name, literal address."""
        try:
            parsed = url if isinstance(url, httpx.URL) else httpx.URL(str(url).strip())
        except (httpx.InvalidURL, TypeError, ValueError) as e:
            self._explain_unparseable(str(url))
            raise UrlRefused(f"invalid URL: {e}") from e
        if parsed.scheme not in ALLOWED_SCHEMES:
            raise UrlRefused(f"refused scheme '{parsed.scheme or '(none)'}': only http and https are fetched")
        if parsed.userinfo:
            raise UrlRefused("refused URL with credentials (user:password@host)")
        host = parsed.host.lower().rstrip(".")
        if not host:
            raise UrlRefused("refused URL without a host")
        if self.host_allowed(host):
            return parsed
        if host in BLOCKED_HOSTNAMES or any(host.endswith(s) for s in BLOCKED_SUFFIXES):
            raise UrlRefused(f"refused private host name '{host}'")
        ip = parse_ip(host)
        if ip is not None:
            self.check_ip(ip, host)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        if port not in self.ports:
            raise UrlRefused(f"refused port {port}: only ports {', '.join(map(str, sorted(self.ports)))} are "
                             "fetched (tools.allow_ports)")
        return parsed

    def _explain_unparseable(self, url: str) -> None:
        """For a URL httpx cannot parse (e.g. an octal IPv4 host), refuse with the address reason if any."""
        try:
            host = urlsplit(url.strip()).hostname
        except ValueError:
            return
        if host and not self.host_allowed(host):
            ip = parse_ip(host)
            if ip is not None:
                self.check_ip(ip, host)

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """Resolve `host` and check every answer; refuse the host if any answer is forbidden."""
        h = host.lower().rstrip(".").strip("[]")
        literal = parse_ip(h)
        if literal is not None:
            if not self.host_allowed(h):
                self.check_ip(literal, h)
            return [literal]
        if not self.host_allowed(h) and (h in BLOCKED_HOSTNAMES or any(h.endswith(s) for s in BLOCKED_SUFFIXES)):
            raise UrlRefused(f"refused private host name '{h}'")
        try:
            answers = await self.resolver(h, port)
        except socket.gaierror as e:
            if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                raise HostNotFound(f"host '{h}' does not exist (DNS)") from e
            raise httpcore.ConnectError(f"cannot resolve host '{h}': {e}") from e
        except (OSError, UnicodeError) as e:
            raise httpcore.ConnectError(f"cannot resolve host '{h}': {e}") from e
        if not answers:
            raise httpcore.ConnectError(f"host '{h}' has no addresses")
        addrs = [ipaddress.ip_address(a.split("%", 1)[0]) for a in answers]
        if self.host_allowed(h):
            return addrs
        return [self.check_ip(a, h, resolved=True) for a in addrs]


class GuardedNetworkBackend(httpcore.AsyncNetworkBackend):
    """httpcore network backend that connects only to addresses the guard approved (no rebinding)."""

    def __init__(self, guard: UrlGuard, inner: httpcore.AsyncNetworkBackend | None = None):
        self.guard = guard
        self.inner = inner or httpcore.AnyIOBackend()
        self.connected: list[str] = []
        """Addresses connected to, most recent last (bounded; for diagnostics and tests)."""

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        addrs = await asyncio.wait_for(self.guard.resolve(host, port), timeout)
        last: Exception | None = None
        for addr in addrs:
            try:
                stream = await self.inner.connect_tcp(str(addr), port, timeout=timeout,
                                                      local_address=local_address, socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                last = e
                continue
            peer = stream.get_extra_info("server_addr")
            if peer:
                try:
                    if not self.guard.host_allowed(host):
                        self.guard.check_ip(str(peer[0]), host, resolved=True)
                except UrlRefused:
                    await stream.aclose()
                    raise
            self.connected = [*self.connected[-99:], str(addr)]
            return stream
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        raise UrlRefused("refused unix socket connection")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx transport whose every TCP connection goes through `GuardedNetworkBackend`.

    Proxies from the environment are ignored (`trust_env=False`): a proxy would make the
    connection we check differ from the host we fetch.
    """

    def __init__(self, guard: UrlGuard, *, max_connections: int = 100, verify: bool = True):
        super().__init__(trust_env=False, verify=verify)
        if not hasattr(self, "_pool"):
            raise RuntimeError("this httpx version has no AsyncHTTPTransport._pool; GuardedTransport needs updating")
        self.backend = GuardedNetworkBackend(guard)
        ssl_context = self._pool._ssl_context  # type: ignore[attr-defined]
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=max_connections, max_keepalive_connections=20,
            keepalive_expiry=5.0, http1=True, http2=False, network_backend=self.backend)
