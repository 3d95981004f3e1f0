"""A Python client of test/clients, as an agent's code uses requests, httpx or aiohttp.

    python_client.py LIBRARY '[{"method": "GET", "url": "...", "json": {...}}, ...]'

LIBRARY is urllib (urllib.request.urlopen), requests, httpx, httpx-h2
(httpx.Client(http2=True)), aiohttp (a
ClientSession as it is, which reads no proxy variable) or aiohttp-trust-env
(ClientSession(trust_env=True)). Each request is made with the library's
defaults otherwise, so the proxy (HTTPS_PROXY) and the CA bundle
(REQUESTS_CA_BUNDLE, SSL_CERT_FILE) come from the environment, as `egressd ca
env` sets them. One JSON line per request: what the library returned (status,
reason phrase, HTTP version, headers, body) and what a program that calls
raise_for_status() prints (urllib: the HTTPError it raises), or the exception the
request raised.
"""
import asyncio
import json
import sys


def with_requests(spec):
    import requests

    out = {}
    try:
        r = requests.request(spec["method"], spec["url"], json=spec.get("json"), timeout=20)
        out.update(status=r.status_code, reason=r.reason, http_version="HTTP/1.1",
                   headers=dict(r.headers), body=r.text)
        try:
            r.raise_for_status()
        except requests.HTTPError as e:
            out["raised"] = str(e)
    except requests.RequestException as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def with_urllib(spec):
    import urllib.error
    import urllib.request

    out = {}
    data = json.dumps(spec["json"]).encode() if spec.get("json") else None
    req = urllib.request.Request(spec["url"], data=data, method=spec["method"],
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            out.update(status=r.status, reason=r.reason, http_version=f"HTTP/{r.version / 10:.1f}",
                       headers=dict(r.headers), body=r.read().decode())
    except urllib.error.HTTPError as e:
        out.update(status=e.code, reason=e.reason, http_version="HTTP/1.1", headers=dict(e.headers),
                   body=e.read().decode(), raised=str(e))
    except (urllib.error.URLError, OSError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def with_httpx(client, spec):
    import httpx

    out = {}
    try:
        r = client.request(spec["method"], spec["url"], json=spec.get("json"))
        out.update(status=r.status_code, reason=r.reason_phrase, http_version=r.http_version,
                   headers=dict(r.headers), body=r.text)
        try:
            r.raise_for_status()
        except httpx.HTTPStatusError as e:
            out["raised"] = str(e)
    except httpx.HTTPError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


async def with_aiohttp(specs, trust_env):
    import aiohttp

    outs = []
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(trust_env=trust_env, timeout=timeout) as session:
        for spec in specs:
            out = {}
            try:
                async with session.request(spec["method"], spec["url"], json=spec.get("json")) as r:
                    body = await r.text()
                    out.update(status=r.status, reason=r.reason, headers=dict(r.headers), body=body,
                               http_version=f"HTTP/{r.version.major}.{r.version.minor}")
                    try:
                        r.raise_for_status()
                    except aiohttp.ClientResponseError as e:
                        out["raised"] = str(e)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                out["error"] = f"{type(e).__name__}: {e}"
            outs.append(out)
    return outs


def main():
    lib, specs = sys.argv[1], json.loads(sys.argv[2])
    if lib.startswith("aiohttp"):
        outs = asyncio.run(with_aiohttp(specs, lib == "aiohttp-trust-env"))
        for spec, out in zip(specs, outs):
            out["url"] = spec["url"]
            print(json.dumps(out), flush=True)
        return
    client = None
    if lib.startswith("httpx"):
        import httpx

        client = httpx.Client(http2=lib == "httpx-h2", timeout=20)
    for spec in specs:
        if lib == "urllib":
            out = with_urllib(spec)
        elif client is None:
            out = with_requests(spec)
        else:
            out = with_httpx(client, spec)
        out["url"] = spec["url"]
        print(json.dumps(out), flush=True)


main()
