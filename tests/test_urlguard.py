"""URL guard: private/loopback/metadata targets are refused in every spelling, after DNS and redirects."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from fixtures.web import FixtureWeb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.page_access import PageFetcher
from tools.urlguard import UrlGuard, UrlRefused, embedded_ipv4, forbidden_reason, parse_ip, parse_ipv4_literal

FORBIDDEN_V4 = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
    "224.0.0.0/4", "240.0.0.0/4")]
FORBIDDEN_V6 = [ipaddress.ip_network(n) for n in ("::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "fec0::/10")]


def forbidden_v4() -> st.SearchStrategy[ipaddress.IPv4Address]:
    return st.sampled_from(FORBIDDEN_V4).flatmap(
        lambda net: st.integers(0, net.num_addresses - 1).map(lambda off: net[off]))


def public_v4() -> st.SearchStrategy[ipaddress.IPv4Address]:
    return st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address).filter(
        lambda ip: ip.is_global and not any(ip in n for n in FORBIDDEN_V4) and forbidden_reason(ip) is None)


def spellings(ip: ipaddress.IPv4Address) -> list[str]:
    """The same IPv4 address written the ways inet_aton (and therefore many resolvers) accept."""
    n = int(ip)
    a, b, c, d = ip.packed
    return [str(ip), str(n), hex(n), "0" + oct(n)[2:], f"{a}.{(b << 16) | (c << 8) | d}",
            f"{a}.{b}.{(c << 8) | d}", f"0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}", f"0{a:o}.0{b:o}.0{c:o}.0{d:o}"]


def v6_wrappings(ip: ipaddress.IPv4Address) -> list[str]:
    """IPv6 forms that carry the IPv4 address: mapped, compatible, translated, 6to4, NAT64."""
    n = int(ip)
    return [f"::ffff:{ip}", str(ipaddress.IPv6Address((0xFFFF << 32) | n)), f"::{ip}" if n > 1 else "::ffff:0.0.0.0",
            str(ipaddress.IPv6Address((0xFFFF << 32 << 16) | n)),  # ::ffff:0:a.b.c.d
            str(ipaddress.IPv6Address((0x2002 << 112) | (n << 80) | 1)),  # 6to4
            f"64:ff9b::{ip}"]


# -- static checks --------------------------------------------------------------------------------

@pytest.mark.parametrize("url,needle", [
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://[fd00:ec2::254]/latest/", "metadata"),
    ("http://168.63.129.16/machine", "metadata"),
    ("http://100.100.100.200/latest", "metadata"),
    ("http://metadata.google.internal/computeMetadata/v1/", "private host name"),
    ("http://localhost:8265/api/jobs", "private host name"),
    ("http://LOCALHOST./", "private host name"),
    ("http://ray-head.cluster.local/", "private host name"),
    ("http://foo.localhost/", "private host name"),
    ("http://127.0.0.1:8000/retrieve", "loopback"),
    ("http://127.1/", "loopback"),
    ("http://2130706433/", "loopback"),
    ("http://0x7f000001/", "loopback"),
    ("http://0177.0.0.1/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://[::ffff:7f00:1]/", "loopback"),
    ("http://[::127.0.0.1]/", "loopback"),
    ("http://[2002:7f00:1::1]/", "loopback"),
    ("http://[64:ff9b::a9fe:a9fe]/", "metadata"),
    ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "address"),
    ("http://10.0.0.8/", "private"),
    ("http://172.31.255.1/", "private"),
    ("http://192.168.1.1/admin", "private"),
    ("http://100.64.1.1/", "CGNAT"),
    ("http://0.0.0.0:8000/", "address"),
    ("http://[::]/", "unspecified"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[ff02::1]/", "multicast"),
    ("http://[fe80::1%25eth0]/", "link-local"),
    ("http://[fc00::1]/", "private"),
    ("http://255.255.255.255/", "address"),
    ("file:///etc/passwd", "scheme"),
    ("gopher://example.com/", "scheme"),
    ("javascript:alert(1)", "scheme"),
    ("ftp://example.com/x", "scheme"),
    ("http://user:secret@example.com/", "credentials"),
    ("http://user@example.com/", "credentials"),
    ("http://1.2.3.4.5/", "malformed"),
    ("http://999.1.1.1/", "malformed"),
    ("http://foo.123/", "malformed"),
    ("http:///nohost", "host"),
])
def test_check_url_refuses(url, needle):
    with pytest.raises(UrlRefused, match=needle):
        UrlGuard().check_url(url)


@pytest.mark.parametrize("url", ["https://example.com/a?b=c#frag", "http://93.184.216.34/", "http://[2606:4700::1111]/",
                                 "https://en.wikipedia.org/wiki/Lighthouse", "http://8.8.8.8/"])
def test_check_url_accepts_public(url):
    assert str(UrlGuard().check_url(url)).startswith(url.split("#")[0][:10])


def test_allowlist_overrides_address_checks_but_not_scheme_or_credentials():
    g = UrlGuard(allow=["127.0.0.0/8", "fixture.test", "*.corp.example", "::1"])
    for url in ("http://127.0.0.1:9/", "http://127.5.5.5/", "http://fixture.test/", "http://a.b.corp.example/",
                "http://[::1]/"):
        g.check_url(url)
    with pytest.raises(UrlRefused, match="private"):
        g.check_url("http://10.0.0.1/")
    with pytest.raises(UrlRefused, match="scheme"):
        g.check_url("file://127.0.0.1/etc/passwd")
    with pytest.raises(UrlRefused, match="credentials"):
        g.check_url("http://a:b@127.0.0.1/")


# -- properties -----------------------------------------------------------------------------------

@settings(deadline=None)
@given(forbidden_v4())
def test_every_spelling_of_a_forbidden_ipv4_is_refused(ip):
    g = UrlGuard()
    for text in spellings(ip):
        assert parse_ipv4_literal(text) == ip, text
        with pytest.raises(UrlRefused):
            g.check_url(f"http://{text}/")


@settings(deadline=None)
@given(forbidden_v4())
def test_forbidden_ipv4_inside_ipv6_is_refused(ip):
    g = UrlGuard()
    for text in v6_wrappings(ip):
        v6 = ipaddress.IPv6Address(text)
        assert forbidden_reason(v6) is not None, text
        with pytest.raises(UrlRefused):
            g.check_url(f"http://[{text}]/")


@settings(deadline=None)
@given(st.sampled_from(FORBIDDEN_V6).flatmap(lambda n: st.integers(0, 2**20).map(lambda o: n[o % n.num_addresses])))
def test_forbidden_ipv6_is_refused(ip):
    with pytest.raises(UrlRefused):
        UrlGuard().check_url(f"http://[{ip}]/")


@settings(deadline=None)
@given(public_v4())
def test_public_ipv4_passes_in_every_spelling(ip):
    g = UrlGuard()
    g.check_url(f"http://{ip}/")
    for text in spellings(ip):
        assert parse_ipv4_literal(text) == ip
        try:
            g.check_url(f"http://{text}/")
        except UrlRefused as e:  # spellings httpx cannot parse are refused as invalid, never as "private"
            assert str(e).startswith("invalid URL"), str(e)
    assert embedded_ipv4(ipaddress.IPv6Address(f"::ffff:{ip}")) == [ip]


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.sampled_from(["d", "x", "o"])), min_size=1, max_size=4))
def test_ipv4_parser_agrees_with_inet_aton(parts):
    """Our parser reads numeric hosts exactly as the C library's inet_aton does (or refuses them)."""
    text = ".".join(hex(v) if b == "x" else ("0" + oct(v)[2:] if b == "o" else str(v)) for v, b in parts)
    try:
        expected = ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        expected = None
    try:
        ours = parse_ipv4_literal(text)
    except UrlRefused:
        ours = None
    assert ours == expected


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_hosts_never_crash_the_guard(host):
    g = UrlGuard()
    try:
        url = g.check_url(f"http://{host}/")
    except UrlRefused:
        return
    ip = parse_ip(url.host) if url.host else None
    assert ip is None or forbidden_reason(ip) is None


# -- DNS resolution, pinning and redirects (real loopback server) ---------------------------------

def resolver_from(table: dict[str, list[list[str]]], calls: list[str]):
    """A resolver answering from `table`; each name pops its next answer (to model rebinding)."""
    async def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        answers = table[host]
        return answers.pop(0) if len(answers) > 1 else answers[0]
    return resolve


@pytest.fixture(scope="module")
def web():
    with FixtureWeb() as server:
        yield server


async def test_name_resolving_to_private_address_is_refused():
    calls: list[str] = []
    g = UrlGuard(resolver=resolver_from({"evil.example": [["10.0.0.5"]],
                                         "mixed.example": [["93.184.216.34", "127.0.0.1"]]}, calls))
    fetcher = PageFetcher(g)
    with pytest.raises(UrlRefused, match="'evil.example' resolves to private address 10.0.0.5"):
        await fetcher.fetch("http://evil.example/")
    with pytest.raises(UrlRefused, match="loopback"):
        await fetcher.fetch("http://mixed.example/")  # one bad answer is enough
    await fetcher.aclose()
    assert calls == ["evil.example", "mixed.example"]


async def test_connection_is_pinned_to_the_checked_address(web):
    """DNS rebinding: the name is resolved once per connection and we connect to that very address."""
    calls: list[str] = []
    table = {"fixture.test": [["127.0.0.1"], ["10.9.9.9"]]}  # first answer allowed, second would be private
    g = UrlGuard(allow=["127.0.0.1/32"], resolver=resolver_from(table, calls), ports=[web.port])
    fetcher = PageFetcher(g)
    got = await fetcher.fetch(f"http://fixture.test:{web.port}/article")
    assert got.status == 200 and b"Veyra Lighthouse" in got.body
    assert calls == ["fixture.test"]
    assert fetcher.client()._transport.backend.connected[-1] == "127.0.0.1"  # type: ignore[attr-defined]
    assert web.headers["/article"]["Host"] == f"fixture.test:{web.port}"  # virtual host kept
    await fetcher.aclose()
    fresh = PageFetcher(g)  # new connection: the rebinding answer is checked and refused
    with pytest.raises(UrlRefused, match="10.9.9.9"):
        await fresh.fetch(f"http://fixture.test:{web.port}/article")
    await fresh.aclose()


@pytest.mark.parametrize("target,needle", [
    ("http://169.254.169.254/latest/meta-data/iam/", "metadata"),
    ("http://10.0.0.1/admin", "private"),
    ("http://[::ffff:169.254.169.254]/", "metadata"),
    ("http://localhost:{port}/article", "private host name"),
    ("http://2130706433:{port}/article", None),  # allowed: 127.0.0.1 is on the allowlist as a CIDR
    ("file:///etc/passwd", "scheme"),
])
async def test_every_redirect_hop_is_checked(web, target, needle):
    g = UrlGuard(allow=["127.0.0.1/32"])
    fetcher = PageFetcher(g)
    url = web.url("/redirect/to?url=" + target.format(port=web.port))
    if needle is None:
        got = await fetcher.fetch(url)
        assert got.status == 200 and got.redirects
    else:
        with pytest.raises(UrlRefused, match=needle):
            await fetcher.fetch(url)
    await fetcher.aclose()


async def test_loopback_server_refused_without_allowlist(web):
    before = web.hits["/plain"]
    fetcher = PageFetcher(UrlGuard())
    with pytest.raises(UrlRefused, match="loopback"):
        await fetcher.fetch(web.url("/plain"))
    await fetcher.aclose()
    assert web.hits["/plain"] == before  # refused before any connection was made
