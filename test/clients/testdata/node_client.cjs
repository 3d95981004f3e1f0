// The Node client of test/clients.
//
//   node node_client.cjs undici|fetch|fetch-global '[{"method": "GET", "url": "...", "body": "..."}, ...]'
//
// undici: undici's own fetch, through a ProxyAgent naming HTTPS_PROXY when it is
// set (Node's documented way to use a proxy with undici). fetch: Node 20's
// built-in fetch as it is, which reads no proxy variable. fetch-global: the
// built-in fetch after setGlobalDispatcher(new EnvHttpProxyAgent()), which reads
// HTTP_PROXY, HTTPS_PROXY and NO_PROXY. The CA comes from NODE_EXTRA_CA_CERTS.
// One JSON line per request: status, status text, headers and body, or the
// error as Node reports it (message and cause).
'use strict';

async function main() {
  const [how, raw] = process.argv.slice(2);
  let fetchFn = globalThis.fetch;
  let dispatcher;
  if (how === 'undici') {
    const undici = require('undici');
    fetchFn = undici.fetch;
    const proxy = process.env.HTTPS_PROXY;
    if (proxy) dispatcher = new undici.ProxyAgent(proxy);
  } else if (how === 'fetch-global') {
    const undici = require('undici');
    undici.setGlobalDispatcher(new undici.EnvHttpProxyAgent());
  }
  for (const spec of JSON.parse(raw)) {
    const out = { url: spec.url };
    try {
      const r = await fetchFn(spec.url, {
        method: spec.method, body: spec.body, dispatcher,
        headers: spec.body ? { 'content-type': 'application/json' } : undefined,
        signal: AbortSignal.timeout(20000),
      });
      out.status = r.status;
      out.statusText = r.statusText;
      out.headers = Object.fromEntries(r.headers);
      out.body = await r.text();
    } catch (e) {
      out.error = `${e.name}: ${e.message}`;
      if (e.cause) out.error += ` (cause: ${e.cause.code || e.cause.name}: ${e.cause.message})`;
    }
    console.log(JSON.stringify(out));
  }
}

main();
