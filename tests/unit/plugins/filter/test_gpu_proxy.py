"""The proxy filters: validation with the password masked, the environment, no_proxy matching."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))

import gpu_proxy

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    "url, masked",
    [
        (f"http://ops:{SECRET}@proxy.example.com:3128", "http://ops:****@proxy.example.com:3128"),
        (f"https://ops:{SECRET}@10.0.0.1:8443/", "https://ops:****@10.0.0.1:8443/"),
        # A password may hold an @: the host is after the last one.
        ("http://ops:p@ss@proxy:3128", "http://ops:****@proxy:3128"),
        ("http://ops@proxy:3128", "http://ops@proxy:3128"),
        ("http://proxy:3128", "http://proxy:3128"),
        ("not a url", "not a url"),
        (f"ops:{SECRET}@proxy:3128", "ops:****@proxy:3128"),
        (None, ""),
    ],
)
def test_masked_hides_only_the_password(url, masked):
    assert gpu_proxy.masked(url) == masked


@pytest.mark.parametrize("proxy", [None, "", {}, {"url": ""}, {"url": "", "no_proxy": []}])
def test_no_proxy_is_no_problem_and_no_environment(proxy):
    assert gpu_proxy.problem(proxy, "tf_venv_proxy") == ""
    assert gpu_proxy.env(proxy) == {}
    assert gpu_proxy.proxy_for(proxy, "https://pypi.org/simple/") == ""


@pytest.mark.parametrize(
    "url",
    [
        "http://proxy.example.com:3128",
        f"http://ops:{SECRET}@proxy.example.com:3128",
        "https://[2001:db8::1]:3129/",
        "http://10.0.0.1",
    ],
)
def test_good_urls_pass(url):
    assert gpu_proxy.problem({"url": url, "no_proxy": ["localhost", ".example.com"]}, "tf_venv_proxy") == ""


@pytest.mark.parametrize(
    "url, why",
    [
        (f"ftp://ops:{SECRET}@proxy:3128", "its scheme is ftp, not http or https"),
        (f"ops:{SECRET}@proxy:3128", "it has no scheme (http:// or https://)"),
        ("proxy.example.com:3128", "it has no scheme"),
        ("http://", "it names no host"),
        (f"http://ops:{SECRET}@proxy:port", "its host or port cannot be read"),
        ("http://proxy:99999", "its host or port cannot be read"),
        ("http://[::1:3128", "its host or port cannot be read"),
        ("http://proxy:3128/some/path", "no path, query or fragment"),
        ("http://proxy :3128", "white space"),
    ],
)
def test_a_malformed_url_is_named_with_the_password_masked_and_the_fix(url, why):
    text = gpu_proxy.problem({"url": url}, "nvidia_driver_proxy")
    assert why in text
    assert text.startswith("nvidia_driver_proxy (by default gpu_preflight_proxy) url ")
    assert "Set nvidia_driver_proxy (by default gpu_preflight_proxy) to {url: http://proxy.example.com:3128" in text
    assert SECRET not in text


def test_the_fleet_setting_is_named_once():
    text = gpu_proxy.problem({"url": "ftp://p"}, "gpu_preflight_proxy")
    assert text.startswith("gpu_preflight_proxy url 'ftp://p'")
    assert "(by default" not in text


@pytest.mark.parametrize(
    "proxy, phrase",
    [
        (f"http://ops:{SECRET}@proxy:3128", "is 'http://ops:****@proxy:3128', not a dictionary with url and no_proxy"),
        (["http://proxy:3128"], "is 'list', not a dictionary"),
        ({"url": "http://proxy:3128", "https": "x"}, "unknown key(s) https; it takes url and no_proxy"),
        ({"url": "http://proxy:3128", "no_proxy": 3}, "no_proxy is 3, not a list"),
        ({"url": "http://proxy:3128", "no_proxy": ["ok.example.com", "http://bad/"]}, "no_proxy has 'http://bad/'"),
    ],
)
def test_a_malformed_setting_is_named(proxy, phrase):
    text = gpu_proxy.problem(proxy, "gpu_artifacts_proxy")
    assert phrase in text
    assert SECRET not in text


def test_env_sets_both_spellings_and_no_proxy():
    url = f"http://ops:{SECRET}@proxy:3128"
    assert gpu_proxy.env({"url": url, "no_proxy": ["localhost", " .example.com "]}) == {
        "http_proxy": url,
        "https_proxy": url,
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "no_proxy": "localhost,.example.com",
        "NO_PROXY": "localhost,.example.com",
    }
    assert "no_proxy" not in gpu_proxy.env({"url": url})
    assert gpu_proxy.env({"url": url, "no_proxy": "a, b"})["no_proxy"] == "a,b"


@pytest.mark.parametrize(
    "target, through",
    [
        ("https://pypi.org/simple/", True),
        ("https://mirror.example.com/simple/", False),
        ("https://example.com/", False),
        ("https://notexample.com/", True),
        ("http://localhost:8080/", False),
        ("http://10.0.0.5/", True),
    ],
)
def test_proxy_for_honours_no_proxy(target, through):
    proxy = {"url": "http://proxy:3128", "no_proxy": [".example.com", "localhost"]}
    assert gpu_proxy.proxy_for(proxy, target) == ("http://proxy:3128" if through else "")


def test_a_star_bypasses_every_host():
    assert gpu_proxy.proxy_for({"url": "http://proxy:3128", "no_proxy": ["*"]}, "https://pypi.org/") == ""


def test_the_filters_are_exposed():
    assert set(gpu_proxy.FilterModule().filters()) == {
        "gpu_proxy_problem",
        "gpu_proxy_env",
        "gpu_proxy_for",
        "gpu_proxy_masked",
    }
