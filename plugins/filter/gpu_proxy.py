"""Filters for the fleet's HTTP(S) proxy: ``gpu_proxy_problem``, ``gpu_proxy_env``, ``gpu_proxy_for``
and ``gpu_proxy_masked``. Documented in their ``.yml`` files beside this one.

A proxy setting is ``{url, no_proxy}``: ``url`` an ``http://`` or ``https://`` URL with a host and
optionally ``user:password@`` and a port, ``no_proxy`` the hosts and domains reached directly. The
roles hand it to the tasks that reach the network as the conventional environment variables, which
pip (through requests), apt, dnf (librepo, libcurl) and Ansible's get_url all read:

- curl's ``http_proxy``, ``HTTPS_PROXY`` and ``NO_PROXY`` (https://curl.se/docs/manpage.html#ENVIRONMENT);
  curl reads only the lower-case ``http_proxy``, so both spellings are set;
- Python's ``urllib.request.getproxies_environment`` and ``proxy_bypass_environment``
  (https://docs.python.org/3/library/urllib.request.html), used by requests and by Ansible's
  ``fetch_url``;
- apt's ``Acquire::http::Proxy`` defaults to ``http_proxy`` (apt.conf(5),
  https://manpages.debian.org/bookworm/apt/apt.conf.5.en.html).

``no_proxy`` entries follow curl's reading: a host name matches itself and its subdomains (a leading
dot is ignored), ``*`` matches every host. The password of a URL's user information (RFC 3986,
section 3.2.1) is never returned by any filter but ``gpu_proxy_env``, whose value goes to the task's
environment only: messages use ``gpu_proxy_masked``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
MASK = "****"
EXAMPLE = "http://proxy.example.com:3128"


def _url(proxy: Any) -> str:
    if isinstance(proxy, dict):
        return str(proxy.get("url") or "")
    return ""


def _no_proxy(proxy: Any) -> list[str]:
    value = proxy.get("no_proxy") if isinstance(proxy, dict) else None
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else [str(item) for item in value]
    return [item.strip() for item in items if item.strip()]


def masked(url: Any) -> str:
    """``url`` with the password of its user information replaced by ``****``."""
    text = "" if url is None else str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    authority, slash, path = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return text
    user = userinfo.split(":", 1)[0]
    return f"{scheme}{sep}{user}:{MASK}@{hostport}{slash}{path}"


def _url_problem(url: str) -> str:
    """Why ``url`` is not a proxy URL, or an empty string."""
    if any(ch.isspace() for ch in url):
        return "it contains white space"
    if "://" not in url:
        return "it has no scheme (http:// or https://)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        # urlsplit's message may quote the URL's parts: not shown, as the password could be among them.
        return "its host or port cannot be read (the port is a number from 1 to 65535)"
    if parts.scheme not in SCHEMES:
        return f"its scheme is {parts.scheme}, not http or https"
    if not parts.hostname:
        return "it names no host"
    if port == 0:
        return "its port is 0"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "a proxy URL has no path, query or fragment"
    return ""


def problem(proxy: Any, variable: str, fleet: str = "gpu_preflight_proxy") -> str:
    """Why the proxy setting in ``variable`` cannot be used, in one sentence with the fix; empty when it can.

    ``fleet`` is the fleet-wide setting the variable takes by default, named in the fix.
    """
    where = variable if variable == fleet else f"{variable} (by default {fleet})"
    fix = (
        f"Set {where} to {{url: {EXAMPLE}, no_proxy: [localhost, .example.com]}} - "
        "http:// or https://, a host, optionally user:password@ and a port - or leave its url empty for no proxy."
    )
    if proxy is None or proxy == "":
        return ""
    if not isinstance(proxy, dict):
        shown = masked(proxy) if isinstance(proxy, str) else type(proxy).__name__
        return f"{where} is {shown!r}, not a dictionary with url and no_proxy. {fix}"
    unknown = sorted(str(key) for key in proxy if key not in ("url", "no_proxy"))
    if unknown:
        return f"{where} has the unknown key(s) {', '.join(unknown)}; it takes url and no_proxy. {fix}"
    no_proxy = proxy.get("no_proxy")
    if no_proxy is not None and not isinstance(no_proxy, (str, list)):
        return f"{where} no_proxy is {no_proxy!r}, not a list of host names and domains. {fix}"
    bad = [item for item in _no_proxy(proxy) if any(ch.isspace() or ch in "/@" for ch in item)]
    if bad:
        return f"{where} no_proxy has {bad[0]!r}, which is not a host name, domain or address. {fix}"
    url = _url(proxy)
    if not url:
        return ""
    why = _url_problem(url)
    return f"{where} url {masked(url)!r} is not a proxy URL: {why}. {fix}" if why else ""


def env(proxy: Any) -> dict[str, str]:
    """The environment variables that send a task's HTTP and HTTPS requests through the proxy; empty
    without a proxy URL."""
    url = _url(proxy)
    if not url:
        return {}
    out = {name: url for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
    bypass = ",".join(_no_proxy(proxy))
    if bypass:
        out.update(no_proxy=bypass, NO_PROXY=bypass)
    return out


def bypassed(host: str, no_proxy: list[str]) -> bool:
    """Whether ``host`` is reached directly by the ``no_proxy`` list (curl's matching)."""
    host = host.lower().rstrip(".")
    for entry in no_proxy:
        entry = entry.lower().lstrip(".").rstrip(".")
        if entry == "*" or host == entry or host.endswith("." + entry):
            return True
    return False


def proxy_for(proxy: Any, target: str) -> str:
    """The proxy URL a request to ``target`` (a URL) goes through, or an empty string when it goes
    directly (no proxy, or its host is in ``no_proxy``)."""
    url = _url(proxy)
    host = urlsplit(target).hostname or ""
    if not url or bypassed(host, _no_proxy(proxy)):
        return ""
    return url


class FilterModule:
    """Proxy filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpu_proxy_problem": problem,
            "gpu_proxy_env": env,
            "gpu_proxy_for": proxy_for,
            "gpu_proxy_masked": masked,
        }
