// SIGTERM: health turns NOT_SERVING, new requests are refused, running streams finish (or, past
// the drain timeout, end with finish_reason CANCELLED and UNAVAILABLE); the process exits 0.
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
  ]);
})().catch((e) => { console.error(e); process.exit(1); });
