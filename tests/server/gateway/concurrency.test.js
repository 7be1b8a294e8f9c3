// Many streams at once through kimi-gateway, no head-of-line blocking: 32 concurrent streams all
// start before any of them ends and each finishes whole; a client that stops reading its stream
// holds up nobody else, and gets its whole stream once it reads again.
'use strict';
const assert = require('assert');
const http = require('http');
const h = require('./harness');

(async () => {
  const server = await h.startServer();  // 32 state slots: all 32 streams run in one batch
  const gw = await h.startGateway(server);
  const client = h.openai(gw);
  const model = await h.modelName(client);
  const t0 = Date.now();
  const now = () => Date.now() - t0;

  // One stream, timed: when its first text arrived and when it ended.
  async function timedStream(i, maxTokens) {
    const stream = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: `Stream number ${i}` }], max_tokens: maxTokens,
      temperature: 0.8, seed: 100 + i, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } });
    const out = { first: null, end: null, text: '', finish: null, usage: null };
    for await (const chunk of stream) {
      if (chunk.usage) out.usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.content && out.first === null) out.first = now();
        out.text += c.delta.content || '';
        if (c.finish_reason) out.finish = c.finish_reason;
      }
    }
    out.end = now();
    return out;
  }

  await h.run([
    ['32 concurrent streams all start before any ends, and each finishes whole', async () => {
      const results = await Promise.all(Array.from({ length: 32 }, (_, i) => timedStream(i, 48)));
      for (const [i, r] of results.entries()) {
        assert.strictEqual(r.finish, 'length', `stream ${i}`);
        assert.strictEqual(r.usage.completion_tokens, 48, `stream ${i}`);
        assert.ok(r.first !== null, `stream ${i} sent no text`);
      }
      const lastStart = Math.max(...results.map((r) => r.first));
      const firstEnd = Math.min(...results.map((r) => r.end));
      assert.ok(lastStart < firstEnd,
                `a stream started (${lastStart} ms) only after another ended (${firstEnd} ms)`);
      // Batched, each stream is still exactly its own seeded answer.
      for (const i of [0, 13, 31]) {
        const solo = await client.chat.completions.create({
          model, messages: [{ role: 'user', content: `Stream number ${i}` }], max_tokens: 48,
          temperature: 0.8, seed: 100 + i, ignore_eos: true });
        assert.strictEqual(results[i].text, solo.choices[0].message.content, `stream ${i}`);
      }
    }],
    ['a client that stops reading holds up nobody; its stream arrives whole later', async () => {
      // The slow client: plain HTTP, paused after the headers (its socket is not read) until the
      // other streams have ended. Were they queued behind it, they could never end: the test would
      // time out.
      const body = JSON.stringify({ model, prompt: 'slow reader', max_tokens: 600,
                                    ignore_eos: true, stream: true,
                                    stream_options: { include_usage: true } });
      let slowText = '';
      let resume;
      const resumed = new Promise((r) => { resume = r; });
      const slow = new Promise((resolve, reject) => {
        const req = http.request(`${gw.url()}/v1/completions`, {
          method: 'POST', agent: false, headers: { 'content-type': 'application/json' },
        }, (res) => {
          assert.strictEqual(res.statusCode, 200);
          res.pause();
          resumed.then(() => res.resume());
          res.on('data', (d) => { slowText += d; });
          res.on('end', resolve);
          res.on('error', reject);
        });
        req.on('error', reject);
        req.end(body);
      });
      await h.sleep(300);
      const fast = await Promise.all(Array.from({ length: 8 }, (_, i) => timedStream(i, 24)));
      for (const r of fast) assert.strictEqual(r.usage.completion_tokens, 24);
      assert.strictEqual(slowText, '', 'the slow reader read while paused');
      resume();
      await slow;
      assert.ok(slowText.endsWith('data: [DONE]\n\n'), slowText.slice(-200));
      const events = slowText.split('\n\n').filter((e) => e.startsWith('data: {'));
      const usage = JSON.parse(events[events.length - 1].slice(6)).usage;
      assert.strictEqual(usage.completion_tokens, 600);
    }],
  ], 120000);
  await gw.stop();
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
