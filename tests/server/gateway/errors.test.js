// Errors through kimi-gateway, in OpenAI's shape and with OpenAI's HTTP statuses, as the official
// client sees them: unsupported parameters (400 naming them), bad values (400 with param, from the
// gateway and from the server), unknown model (404), API keys (401, the gateway's own and passed
// through to the server, and values gRPC cannot carry), a request too large (413, counted after
// decompression), a full queue (429), a backend that is down (503), health before and after the
// backend serves, and a second gateway on a port in use.
'use strict';
const assert = require('assert');
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const h = require('./harness');

function assertApiError(e, status, param, code) {
  assert.strictEqual(e.status, status, `${e.status} ${e.message}`);
  assert.strictEqual(e.param, param, e.message);
  if (code !== undefined) assert.strictEqual(e.code, code, e.message);
  assert.ok(typeof e.error.message === 'string' && e.error.message.length > 0);
  assert.ok(typeof e.type === 'string', 'type');
}

(async () => {
  const dir = h.tmpdir('kimi-gw-keys-');
  fs.writeFileSync(path.join(dir, 'keys.txt'), '# keys\nsk-gw-one\nsk-gw-two\n');
  const server = await h.startServer();
  const gw = await h.startGateway(server);
  const client = h.openai(gw);
  const model = await h.modelName(client);
  const chat = (extra) => ({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4,
                             ...extra });

  await h.run([
    ['an unsupported parameter is a 400 naming it, streaming or not', async () => {
      for (const stream of [false, true]) {
        let e = await h.apiError(() => client.chat.completions.create(chat({
          stream, tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] })));
        assertApiError(e, 400, 'tools', 'unsupported_parameter');
        e = await h.apiError(() => client.chat.completions.create(chat({
          stream, response_format: { type: 'json_object' } })));
        assertApiError(e, 400, 'response_format', 'unsupported_parameter');
        e = await h.apiError(() => client.chat.completions.create({ model, stream, messages: [
          { role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }] }));
        assertApiError(e, 400, 'messages[0].content[0].type', 'unsupported_parameter');
        e = await h.apiError(() => client.completions.create({ model, prompt: 'x', stream,
                                                              echo: true }));
        assertApiError(e, 400, 'echo', 'unsupported_parameter');
        e = await h.apiError(() => client.chat.completions.create(chat({ stream, tempreture: 1 })));
        assertApiError(e, 400, 'tempreture', 'unsupported_parameter');
      }
    }],
    ['bad values are a 400 with the OpenAI parameter, from the gateway or the server', async () => {
      const cases = [
        [{ temperature: -1 }, 'temperature'],   // server: sampling.temperature
        [{ top_p: 2 }, 'top_p'],                // server: sampling.top_p
        [{ presence_penalty: 5 }, 'presence_penalty'],
        [{ max_tokens: 1000000 }, 'max_tokens'],  // server: over limits.max_tokens
        [{ max_tokens: undefined, max_completion_tokens: 1000000 }, 'max_completion_tokens'],
        [{ logprobs: true, top_logprobs: 100 }, 'top_logprobs'],  // server: logprobs limit
        [{ n: 0 }, 'n'],                        // gateway
        [{ temperature: 'hot' }, 'temperature'],  // gateway: type
        [{ stop: [''] }, 'stop[0]'],            // server: empty stop string
        [{ messages: [{ role: 'robot', content: 'x' }] }, 'messages[0].role'],
        [{ messages: [] }, 'messages'],
      ];
      for (const stream of [false, true]) {
        for (const [extra, param] of cases) {
          const e = await h.apiError(() => client.chat.completions.create(chat({ ...extra, stream })));
          assertApiError(e, 400, param);
          assert.strictEqual(e.type, 'invalid_request_error');
        }
      }
      // Refused before any prompt's stream starts: the server counts no cancellation.
      const series = 'kimi_request_cancellations_total{reason="client_cancel"}';
      const before = h.metric(await h.scrape(server), series);
      assert.ok(Number.isFinite(before), series);
      const e = await h.apiError(() => client.completions.create({ model, prompt: ['ok', ''] }));
      assertApiError(e, 400, 'prompt[1]');
      assert.strictEqual(h.metric(await h.scrape(server), series), before);
    }],
    ['a malformed body is a 400 in OpenAI\'s shape; unknown routes are 404', async () => {
      const r = await h.request(gw, 'POST', '/v1/chat/completions', { body: '{"model": ' });
      assert.strictEqual(r.status, 400);
      assert.deepStrictEqual(Object.keys(r.body.error).sort(), ['code', 'message', 'param', 'type']);
      assert.strictEqual(r.body.error.type, 'invalid_request_error');
      const missing = await h.request(gw, 'GET', '/v1/engines');
      assert.strictEqual(missing.status, 404);
      assert.strictEqual(missing.body.error.code, 'unknown_url');
    }],
    ['a request too large for the backend or the gateway is a 413, not a 429 to retry', async () => {
      // 5 MB of prompt: over the server's 4 MiB message limit (gRPC answers RESOURCE_EXHAUSTED).
      const big = JSON.stringify({ model, prompt: 'x '.repeat(2500000), max_tokens: 1 });
      const r = await h.request(gw, 'POST', '/v1/completions', { body: big });
      assert.strictEqual(r.status, 413, JSON.stringify(r.body));
      assert.strictEqual(r.body.error.code, 'request_too_large');
      assert.strictEqual(r.body.error.type, 'invalid_request_error');
      assert.ok(r.body.error.message.includes('server.max_request_bytes'), r.body.error.message);
      // 17 MB: over the gateway's own body limit.
      const huge = JSON.stringify({ model, prompt: 'x '.repeat(8500000), max_tokens: 1 });
      const g = await h.request(gw, 'POST', '/v1/completions', { body: huge });
      assert.strictEqual(g.status, 413);
      assert.strictEqual(g.body.error.code, 'request_too_large');
      // The same with its Content-Length given (as curl and the OpenAI SDKs send it), which
      // httplib refuses by its length (a 400 "could not be read" before).
      const sized = await h.request(gw, 'POST', '/v1/completions', {
        body: huge, headers: { 'content-length': Buffer.byteLength(huge) } });
      assert.strictEqual(sized.status, 413, sized.text);
      assert.strictEqual(sized.body.error.code, 'request_too_large');
      // 40 KB of gzip that inflates to 20 MiB: the limit counts the body as decompressed.
      const padded = Buffer.concat([Buffer.from(`{"model":"${model}","prompt":"x","max_tokens":1`),
                                    Buffer.alloc(20 << 20, ' '), Buffer.from('}')]);
      const zipped = zlib.gzipSync(padded, { level: 9 });
      assert.ok(zipped.length < 100000, `${zipped.length}`);
      const z = await h.request(gw, 'POST', '/v1/completions', {
        body: zipped, headers: { 'content-encoding': 'gzip' } });
      assert.strictEqual(z.status, 413, z.text);
      assert.strictEqual(z.body.error.code, 'request_too_large');
      // The same body kept under the limit is served.
      const small = zlib.gzipSync(Buffer.concat([padded.subarray(0, 60), Buffer.from('}')]));
      const ok = await h.request(gw, 'POST', '/v1/completions', {
        body: small, headers: { 'content-encoding': 'gzip' } });
      assert.strictEqual(ok.status, 200, ok.text);
      // A coding httplib does not inflate (a name in upper case, two codings) is named, not
      // passed on compressed to be called invalid JSON.
      for (const coding of ['GZIP', 'gzip, gzip']) {
        const r = await h.request(gw, 'POST', '/v1/completions', {
          body: small, headers: { 'content-encoding': coding } });
        assert.strictEqual(r.status, 400, r.text);
        assert.strictEqual(r.body.error.code, 'unsupported_content_encoding', r.text);
      }
    }],
    ['a multipart body is a 400 naming the problem (httplib would have thrown: a 500)', async () => {
      const boundary = 'kimiboundary';
      const body = `--${boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n${model}` +
                   `\r\n--${boundary}--\r\n`;
      const r = await h.request(gw, 'POST', '/v1/completions', {
        body, headers: { 'content-type': `multipart/form-data; boundary=${boundary}` } });
      assert.strictEqual(r.status, 400, r.text);
      assert.ok(r.body.error.message.includes('multipart/form-data'), r.text);
    }],
    ['a body is JSON whatever its Content-Type (curl -d sends a form type), past 8 KiB too', async () => {
      const body = JSON.stringify({ model, prompt: 'a'.repeat(9000), max_tokens: 1 });
      const r = await h.request(gw, 'POST', '/v1/completions', {
        body, headers: { 'content-type': 'application/x-www-form-urlencoded' } });
      assert.strictEqual(r.status, 200, r.text);
      assert.strictEqual(r.body.choices.length, 1);
    }],
    ['an Authorization value gRPC cannot carry is a 401, and the gateway stays up', async () => {
      for (const value of ['Bearer \u00e9', 'Bearer sk-a\tb', `Bearer ${'k'.repeat(5000)}`]) {
        for (const route of ['/v1/models', '/v1/chat/completions']) {
          const r = await h.request(gw, route === '/v1/models' ? 'GET' : 'POST', route, {
            body: route === '/v1/models' ? undefined : chat(), headers: { authorization: value } });
          assert.strictEqual(r.status, 401, `${route} ${value.slice(0, 12)}: ${r.text}`);
          assert.strictEqual(r.body.error.code, 'invalid_api_key');
        }
      }
      assert.strictEqual((await h.request(gw, 'GET', '/health')).status, 200);
      const r = await client.chat.completions.create(chat());
      assert.strictEqual(r.choices.length, 1);
    }],
    ['a second gateway cannot listen on a port in use', async () => {
      const e = await h.startGateway(server, ['--listen', `127.0.0.1:${gw.port}`]).then(
        () => null, (err) => err);
      assert.ok(e && /cannot listen on 127\.0\.0\.1:\d+/.test(e.message), String(e));
    }],
    ['an unknown model is a 404 model_not_found', async () => {
      for (const stream of [false, true]) {
        const e = await h.apiError(() => client.chat.completions.create(chat({
          model: 'gpt-4o', stream })));
        assertApiError(e, 404, 'model', 'model_not_found');
        assert.ok(e instanceof h.OpenAI.NotFoundError);
      }
      const e = await h.apiError(() => client.models.retrieve('gpt-4o'));
      assertApiError(e, 404, 'model', 'model_not_found');
    }],
    ['the gateway\'s own keys: a wrong or missing key is a 401 invalid_api_key', async () => {
      const own = await h.startGateway(server, ['--api-keys-file', path.join(dir, 'keys.txt')]);
      try {
        const wrong = h.openai(own, { apiKey: 'sk-nope' });
        let e = await h.apiError(() => wrong.chat.completions.create(chat()));
        assertApiError(e, 401, null, 'invalid_api_key');
        assert.ok(e instanceof h.OpenAI.AuthenticationError);
        e = await h.apiError(() => wrong.models.list());
        assertApiError(e, 401, null, 'invalid_api_key');
        const none = await h.request(own, 'POST', '/v1/chat/completions', { body: chat() });
        assert.strictEqual(none.status, 401);
        assert.strictEqual(none.body.error.code, 'invalid_api_key');
        const right = h.openai(own, { apiKey: 'sk-gw-two' });
        const r = await right.chat.completions.create(chat());
        assert.strictEqual(r.choices.length, 1);
        // Health stays open for probes.
        assert.strictEqual((await h.request(own, 'GET', '/health')).status, 200);
      } finally {
        await own.stop();
      }
    }],
    ['without own keys the client\'s key goes to the server: its UNAUTHENTICATED is a 401', async () => {
      const locked = await h.startServer(['--api-keys-file', path.join(dir, 'keys.txt')]);
      const pass = await h.startGateway(locked);
      try {
        const wrong = h.openai(pass, { apiKey: 'sk-nope' });
        let e = await h.apiError(() => wrong.models.list());
        assertApiError(e, 401, null, 'invalid_api_key');
        e = await h.apiError(() => wrong.chat.completions.create(chat({ stream: true })));
        assertApiError(e, 401, null, 'invalid_api_key');
        const right = h.openai(pass, { apiKey: 'sk-gw-one' });
        const r = await right.chat.completions.create(chat());
        assert.strictEqual(r.choices[0].finish_reason !== null, true);
        // The cached model name must not let a wrong key through either, nor the model list.
        e = await h.apiError(() => wrong.chat.completions.create(chat()));
        assertApiError(e, 401, null, 'invalid_api_key');
        assert.strictEqual((await right.models.list()).data.length, 1);
        e = await h.apiError(() => wrong.models.list());
        assertApiError(e, 401, null, 'invalid_api_key');
        const none = await h.request(pass, 'GET', '/v1/models');
        assert.strictEqual(none.status, 401, none.text);
        const text = await h.scrape(locked);
        assert.ok(h.metric(text, 'kimi_auth_failures_total') >= 3);
      } finally {
        await pass.stop();
        await locked.stop();
      }
    }],
    ['a full queue is a 429 rate_limit_exceeded (before any stream begins)', async () => {
      const small = await h.startServer(['--batching.max_waiting', '1', '--batching.max_running', '1']);
      const g = await h.startGateway(small);
      try {
        const c = h.openai(g);
        const body = { model, prompt: 'burst', max_tokens: 64, ignore_eos: true };
        const settle = (p) => p.then((r) => ({ r }), (e) => ({ e }));
        for (const stream of [false, true]) {
          const results = await Promise.all(Array.from({ length: 8 }, () => settle(
            c.completions.create({ ...body, stream }).then((r) => (stream ? h.collect(r) : r)))));
          const limited = results.filter((x) => x.e);
          const served = results.filter((x) => x.r);
          assert.ok(limited.length >= 1, 'no request was refused');
          assert.ok(served.length >= 1, 'no request was served');
          for (const { e } of limited) {
            assertApiError(e, 429, null, 'rate_limit_exceeded');
            assert.ok(e instanceof h.OpenAI.RateLimitError);
            assert.strictEqual(e.headers.get('retry-after'), '1');
          }
        }
      } finally {
        await g.stop();
        await small.stop();
      }
    }],
    ['backend down: /health and requests are 503; once it serves, /health is 200', async () => {
      const port = await h.freePort();
      const g = await h.startGateway(`127.0.0.1:${port}`);
      try {
        const health = await h.request(g, 'GET', '/health');
        assert.strictEqual(health.status, 503);
        assert.strictEqual(health.body.error.code, 'service_unavailable');
        const c = h.openai(g);
        let e = await h.apiError(() => c.chat.completions.create(chat()));
        assertApiError(e, 503, null, 'service_unavailable');
        e = await h.apiError(() => c.chat.completions.create(chat({ stream: true })));
        assertApiError(e, 503, null, 'service_unavailable');
        e = await h.apiError(() => c.models.list());
        assertApiError(e, 503, null, 'service_unavailable');
        const late = await h.startServer(['--listen', `127.0.0.1:${port}`], { waitServing: false });
        try {
          assert.strictEqual(late.port, port);
          await h.waitFor(async () => (await h.request(g, 'GET', '/health')).status === 200, 30000,
                          'gateway health 200 after the backend serves');
          const r = await c.chat.completions.create(chat());
          assert.strictEqual(r.choices.length, 1);
        } finally {
          await late.stop();
        }
        await h.waitFor(async () => (await h.request(g, 'GET', '/health')).status === 503, 10000,
                        'gateway health 503 after the backend stops');
      } finally {
        await g.stop();
      }
    }],
  ]);
  await gw.stop();
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
