// A client cancel or an expired deadline stops the request within a step and frees its state;
// the metrics count both.
'use strict';
const assert = require('assert');
const h = require('./harness');

(async () => {
  const server = await h.startServer();
  const c = h.client(server);
  const slotsUsed = async () => h.metric(await h.scrape(server), 'kimi_kda_state_slots{state="used"}');
  await h.run([
    ['cancel mid-stream frees the slot and is counted', async () => {
      const before = h.metric(await h.scrape(server),
                              'kimi_request_cancellations_total{reason="client_cancel"}');
      const call = c.Generate({ text: 'long', max_tokens: 4000, ignore_eos: true });
      let received = 0;
      await new Promise((resolve) => {
        call.on('data', () => { if (++received === 5) call.cancel(); });
        call.on('error', (e) => { assert.strictEqual(e.code, h.grpc.status.CANCELLED); resolve(); });
        call.on('end', resolve);
      });
      assert.ok(received >= 5 && received < 4000);
      await h.waitFor(async () => (await slotsUsed()) === 0, 5000, 'slot to be freed');
      await h.waitFor(async () => h.metric(await h.scrape(server),
        'kimi_request_cancellations_total{reason="client_cancel"}') === before + 1, 5000,
      'cancellation metric');
      const text = await h.scrape(server);
      assert.strictEqual(h.metric(text, 'kimi_mla_kv_pages{state="used"}'), 0);
    }],
    ['a cancel well before a short deadline is the client\'s, not the deadline\'s', async () => {
      // A deadline of 240 ms and a cancel at the first token: with a fixed 250 ms margin, any
      // cancel of a call this short was taken for its deadline; now the margin is a quarter of
      // the call's time (60 ms). Checked when the first token comes early enough to tell.
      const series = 'kimi_request_cancellations_total{reason="client_cancel"}';
      const before = h.metric(await h.scrape(server), series);
      const t0 = Date.now();
      let cancelledAt = -1;
      const call = c.Generate({ text: 'short deadline', max_tokens: 4000, ignore_eos: true },
                              new h.grpc.Metadata(), { deadline: t0 + 240 });
      await new Promise((resolve) => {
        call.on('data', () => {
          if (cancelledAt < 0) {
            cancelledAt = Date.now() - t0;
            call.cancel();
          }
        });
        call.on('error', () => resolve());
        call.on('end', resolve);
      });
      if (cancelledAt < 0 || cancelledAt > 120) {
        console.log(`  (first token at ${cancelledAt} ms: too late to tell on this host)`);
        return;
      }
      await h.waitFor(async () => h.metric(await h.scrape(server), series) === before + 1, 5000,
                      'the cancel counted as the client\'s');
    }],
    ['an expired deadline ends the stream with DEADLINE_EXCEEDED, counted as a deadline', async () => {
      const series = ['kimi_request_cancellations_total{reason="deadline"}',
                      'kimi_request_cancellations_total{reason="client_cancel"}',
                      'kimi_requests_total{finish_reason="cancelled"}'];
      const counts = async () => {
        const text = await h.scrape(server);
        return series.map((s) => h.metric(text, s) || 0);
      };
      const before = await counts();
      // Deadlines from 20 ms (the client's reset can reach the server just before its own copy
      // of the deadline passes) to 300 ms (the scheduler's deadline check, or gRPC's, ends it).
      const deadlines = [20, 40, 60, 80, 120, 160, 200, 300];
      const results = await Promise.all(deadlines.map((ms) => h.generate(
        c, { text: `deadline ${ms}`, max_tokens: 4000, ignore_eos: true }, new h.grpc.Metadata(),
        { deadline: Date.now() + ms })));
      for (const r of results) {
        assert.ok(r.error, 'the stream should not finish 4000 tokens in 300 ms');
        assert.strictEqual(r.error.code, h.grpc.status.DEADLINE_EXCEEDED);
      }
      await h.waitFor(async () => (await slotsUsed()) === 0, 5000, 'slots to be freed');
      const n = deadlines.length;
      await h.waitFor(async () => (await counts())[2] === before[2] + n, 5000,
                      'every request counted as cancelled');
      const after = await counts();
      assert.deepStrictEqual(after.map((v, i) => v - before[i]), [n, 0, n],
                             `${series.join(', ')}: ${JSON.stringify(before)} -> ${JSON.stringify(after)}`);
    }],
    ['a cancelled request does not disturb the others', async () => {
      const keep = h.generate(c, { text: 'keep', max_tokens: 40, ignore_eos: true,
                                   sampling: { temperature: 0 } });
      const call = c.Generate({ text: 'drop', max_tokens: 4000, ignore_eos: true });
      call.on('data', () => call.cancel());
      call.on('error', () => {});
      const r = await keep;
      const solo = await h.generate(c, { text: 'keep', max_tokens: 40, ignore_eos: true,
                                         sampling: { temperature: 0 } });
      assert.deepStrictEqual(r.tokens, solo.tokens);
    }],
  ]);
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
