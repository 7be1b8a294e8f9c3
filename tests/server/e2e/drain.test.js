// SIGTERM: health turns NOT_SERVING, new requests are refused, running streams finish (or, past
// the drain timeout or at a second signal, end with finish_reason CANCELLED and UNAVAILABLE); the
// process exits 0. A signal during start-up stops the server at once, without serving.
'use strict';
const assert = require('assert');
const h = require('./harness');

(async () => {
  await h.run([
    ['streams in flight finish within the drain timeout', async () => {
      const server = await h.startServer(['--server.drain_timeout_seconds', '30']);
      const c = h.client(server);
      const streams = Array.from({ length: 6 }, (_, i) =>
        h.generate(c, { text: `drain ${i}`, max_tokens: 150, ignore_eos: true }));
      await new Promise((r) => setTimeout(r, 100));
      const stopped = server.stop();
      // While draining: NOT_SERVING, and new work is refused.
      await h.waitFor(async () => {
        const r = await h.unary(h.healthClient(server), 'Check', { service: '' });
        return r.res && r.res.status === 'NOT_SERVING';
      }, 5000, 'NOT_SERVING');
      const late = await h.generate(c, { text: 'late', max_tokens: 5 });
      assert.strictEqual(late.error && late.error.code, h.grpc.status.UNAVAILABLE);
      const results = await Promise.all(streams);
      for (const r of results) {
        assert.ok(r.final, 'every stream ends with a finish reason');
        assert.strictEqual(r.final.finish_reason, 'FINISH_REASON_LENGTH');
        assert.strictEqual(r.tokens.length, 150);
      }
      const exit = await stopped;
      assert.strictEqual(exit.code, 0, `exit ${JSON.stringify(exit)}\n${server.log}`);
    }],
    ['past the drain timeout, streams end CANCELLED with a clear status', async () => {
      const server = await h.startServer(['--server.drain_timeout_seconds', '0.3']);
      const c = h.client(server);
      const streams = Array.from({ length: 3 }, (_, i) =>
        h.generate(c, { text: `long ${i}`, max_tokens: 4000, ignore_eos: true }));
      await new Promise((r) => setTimeout(r, 200));
      const exit = await server.stop();
      const results = await Promise.all(streams);
      for (const r of results) {
        assert.ok(r.final, 'the last message carries the finish reason');
        assert.strictEqual(r.final.finish_reason, 'FINISH_REASON_CANCELLED');
        assert.ok(r.tokens.length < 4000);
        assert.strictEqual(r.status.code, h.grpc.status.UNAVAILABLE);
        assert.ok(r.status.details.includes('shut down'), r.status.details);
      }
      assert.strictEqual(exit.code, 0, `exit ${JSON.stringify(exit)}\n${server.log}`);
    }],
    ['a second signal cancels the streams still running at once', async () => {
      const server = await h.startServer(['--server.drain_timeout_seconds', '60']);
      const c = h.client(server);
      const streams = Array.from({ length: 3 }, (_, i) =>
        h.generate(c, { text: `again ${i}`, max_tokens: 4000, ignore_eos: true }));
      await h.waitFor(async () => h.metric(await h.scrape(server), 'kimi_requests_running') === 3,
                      10000, 'three streams running');
      const stopped = server.stop();
      await h.waitFor(() => server.log.includes('draining'), 5000, 'the drain to start');
      const t0 = Date.now();
      server.proc.kill('SIGTERM');
      const exit = await stopped;
      const elapsed = Date.now() - t0;
      assert.ok(elapsed < 5000, `exited ${elapsed} ms after the second signal\n${server.log}`);
      assert.strictEqual(exit.code, 0, `exit ${JSON.stringify(exit)}\n${server.log}`);
      for (const r of await Promise.all(streams)) {
        assert.ok(r.final, 'the last message carries the finish reason');
        assert.strictEqual(r.final.finish_reason, 'FINISH_REASON_CANCELLED');
        assert.strictEqual(r.status.code, h.grpc.status.UNAVAILABLE);
        assert.ok(r.status.details.includes('shut down'), r.status.details);
      }
    }],
    ['a signal during start-up stops the server at once, never SERVING', async () => {
      // The hook stretches the load to 6 s; the signal comes 1 s after start.
      const started = Date.now();
      const server = await h.startServer([], { waitServing: false,
                                               env: { KIMI_TEST_LOAD_DELAY_MS: '6000' } });
      await new Promise((r) => setTimeout(r, Math.max(0, started + 1000 - Date.now())));
      const t0 = Date.now();
      const exit = await server.stop();
      const elapsed = Date.now() - t0;
      assert.ok(elapsed < 2000, `exited ${elapsed} ms after the signal\n${server.log}`);
      assert.strictEqual(exit.code, 0, `exit ${JSON.stringify(exit)}\n${server.log}`);
      assert.ok(!/\bSERVING\b/.test(server.log), `reported SERVING:\n${server.log}`);
      assert.ok(server.log.includes('during start-up'), server.log);
    }],
  ]);
})().catch((e) => { console.error(e); process.exit(1); });
