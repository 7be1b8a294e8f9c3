// A client that goes away cancels its request on the server: aborting a stream (one choice or n),
// or abandoning a non-streaming request, shows in kimi-server's metrics as a client_cancel and the
// request's state slot is freed; requests running beside it are undisturbed. SIGTERM drains the
// gateway: open requests finish (or, past the drain time, are cancelled) before it exits.
'use strict';
const assert = require('assert');
const h = require('./harness');

(async () => {
  const server = await h.startServer();
  const gw = await h.startGateway(server);
  const client = h.openai(gw);
  const model = await h.modelName(client);
  const cancels = async () => h.metric(await h.scrape(server),
                                       'kimi_request_cancellations_total{reason="client_cancel"}');
  const slotsUsed = async () => h.metric(await h.scrape(server), 'kimi_kda_state_slots{state="used"}');
  const long = { model, max_tokens: 4000, ignore_eos: true };

  // Reads `stream` until `after` chunks arrived, then aborts it; returns the chunks read.
  async function abortAfter(stream, after) {
    let received = 0;
    for await (const _chunk of stream) {  // the chunks themselves do not matter
      if (++received === after) {
        stream.controller.abort();
        break;
      }
    }
    return received;
  }

  async function expectCancelled(before, count) {
    await h.waitFor(async () => (await cancels()) === before + count, 30000,
                    `client_cancel to reach ${before + count}`);
    await h.waitFor(async () => (await slotsUsed()) === 0, 30000, 'state slots to be freed');
    const text = await h.scrape(server);
    assert.strictEqual(h.metric(text, 'kimi_mla_kv_pages{state="used"}'), 0);
    assert.strictEqual(h.metric(text, 'kimi_requests_running'), 0);
  }

  await h.run([
    ['aborting a chat stream cancels it on the server and frees its state', async () => {
      const before = await cancels();
      const stream = await client.chat.completions.create({
        ...long, messages: [{ role: 'user', content: 'Go on forever.' }], stream: true });
      const received = await abortAfter(stream, 5);
      assert.strictEqual(received, 5);
      await expectCancelled(before, 1);
    }],
    ['aborting a completions stream with n = 3 cancels all three', async () => {
      const before = await cancels();
      const stream = await client.completions.create({ ...long, prompt: 'forever', n: 3,
                                                       stream: true });
      await abortAfter(stream, 10);
      await expectCancelled(before, 3);
    }],
    ['abandoning a non-streaming request cancels it too', async () => {
      const before = await cancels();
      const abort = new AbortController();
      const pending = client.completions.create({ ...long, prompt: 'never read' },
                                                { signal: abort.signal });
      await h.waitFor(async () => (await slotsUsed()) === 1, 30000, 'the request to run');
      abort.abort();
      await assert.rejects(pending, (e) => e instanceof h.OpenAI.APIUserAbortError);
      await expectCancelled(before, 1);
    }],
    ['a cancelled stream does not disturb the others', async () => {
      const req = { model, prompt: 'keep', max_tokens: 40, temperature: 0, ignore_eos: true };
      const keep = client.completions.create(req);
      const drop = await client.completions.create({ ...long, prompt: 'drop', stream: true });
      await abortAfter(drop, 3);
      const r = await keep;
      const solo = await client.completions.create(req);
      assert.strictEqual(r.choices[0].text, solo.choices[0].text);
      assert.strictEqual(r.usage.completion_tokens, 40);
    }],
    ['SIGTERM drains: open streams finish, new requests and /health get 503, then it exits', async () => {
      const gw2 = await h.startGateway(server, ['--drain-timeout-seconds', '60']);
      const c2 = h.openai(gw2);
      const stream = await c2.completions.create({ model, prompt: 'drain', max_tokens: 300,
                                                   temperature: 0, ignore_eos: true, stream: true });
      const it = stream[Symbol.asyncIterator]();
      let text = (await it.next()).value.choices[0].text;
      gw2.proc.kill('SIGTERM');
      await h.waitFor(async () => gw2.log.includes('draining 1 open requests'), 10000, 'the drain');
      assert.strictEqual((await h.request(gw2, 'GET', '/health')).status, 503);
      const refused = await h.request(gw2, 'POST', '/v1/completions',
                                      { body: { model, prompt: 'late', max_tokens: 2 } });
      assert.strictEqual(refused.status, 503);
      assert.strictEqual(refused.body.error.code, 'service_unavailable');
      let finish = null;
      for (let r = await it.next(); !r.done; r = await it.next()) {
        for (const ch of r.value.choices) {
          text += ch.text;
          if (ch.finish_reason) finish = ch.finish_reason;
        }
      }
      assert.strictEqual(finish, 'length');
      const solo = await client.completions.create({ model, prompt: 'drain', max_tokens: 300,
                                                     temperature: 0, ignore_eos: true });
      assert.strictEqual(text, solo.choices[0].text);  // nothing lost
      assert.deepStrictEqual(await gw2.stop(), { code: 0, signal: null });
    }],
    ['past the drain time the rest is cancelled on the server, and its clients are told', async () => {
      const before = await cancels();
      const gw3 = await h.startGateway(server, ['--drain-timeout-seconds', '1']);
      const c3 = h.openai(gw3);
      const stream = await c3.completions.create({ ...long, prompt: 'too long', stream: true });
      const it = stream[Symbol.asyncIterator]();
      await it.next();
      const waiting = c3.completions.create({ ...long, prompt: 'too long, not streamed' })
        .then(() => null, (e) => e);
      await h.waitFor(async () => (await slotsUsed()) === 2, 10000, 'both requests to run');
      gw3.proc.kill('SIGTERM');
      // The stream ends with an error event naming the cause (it was cut off mid-stream), the
      // other request is a 503 to retry elsewhere (it was a 499 without a body).
      const cut = await (async () => {
        try {
          for (let r = await it.next(); !r.done; r = await it.next());
        } catch (e) { return e; }
        return null;
      })();
      assert.ok(cut instanceof h.OpenAI.APIError, String(cut));
      assert.match(cut.message, /gateway shut down before the request finished/);
      const refused = await waiting;
      assert.ok(refused instanceof h.OpenAI.APIError, String(refused));
      assert.strictEqual(refused.status, 503);
      assert.strictEqual(refused.code, 'service_unavailable');
      assert.deepStrictEqual(await gw3.stop(), { code: 0, signal: null });
      // (Their KV pages may stay in the prefix cache: a second of decoding passes snapshots.)
      await h.waitFor(async () => (await cancels()) === before + 2, 30000, 'the cancellations');
      await h.waitFor(async () => (await slotsUsed()) === 0, 30000, 'its state slot to be freed');
    }],
  ]);
  await gw.stop();
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
