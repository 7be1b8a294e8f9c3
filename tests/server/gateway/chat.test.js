// Chat completions through kimi-gateway with the official openai client: models and health,
// non-streaming and streaming answers equal to the server's own for the same request, usage in the
// last chunk, content parts and roles, stop sequences, seeds, n > 1 and logprobs.
'use strict';
const assert = require('assert');
const h = require('./harness');

(async () => {
  const server = await h.startServer();
  const gw = await h.startGateway(server);
  const client = h.openai(gw);
  const grpc = h.client(server);
  const model = await h.modelName(client);
  const user = (content) => [{ role: 'user', content }];

  await h.run([
    ['GET /health is 200; GET /v1/models lists the served model', async () => {
      const health = await h.request(gw, 'GET', '/health');
      assert.strictEqual(health.status, 200, health.text);
      assert.deepStrictEqual(health.body, { status: 'ok' });
      const info = (await h.unary(grpc, 'GetModelInfo', {})).res;
      const list = await client.models.list();
      assert.deepStrictEqual(list.data.map((m) => m.id), [info.model_name]);
      assert.strictEqual(list.data[0].object, 'model');
      const one = await client.models.retrieve(model);
      assert.strictEqual(one.id, model);
    }],
    ['non-streaming chat equals the server\'s answer to the same messages', async () => {
      const messages = [{ role: 'system', content: 'You are terse.' },
                        { role: 'user', content: 'Say something.' }];
      const r = await client.chat.completions.create({
        model, messages, max_tokens: 10, temperature: 0, ignore_eos: true });
      assert.strictEqual(r.object, 'chat.completion');
      assert.match(r.id, /^chatcmpl-/);
      assert.strictEqual(r.model, model);
      assert.strictEqual(r.choices.length, 1);
      const c = r.choices[0];
      assert.strictEqual(c.index, 0);
      assert.strictEqual(c.message.role, 'assistant');
      assert.strictEqual(c.finish_reason, 'length');
      assert.strictEqual(r.usage.completion_tokens, 10);
      const direct = await h.generate(grpc, { chat: { messages }, max_tokens: 10,
                                              sampling: { temperature: 0 }, ignore_eos: true });
      assert.strictEqual(c.message.content, direct.text);
      assert.strictEqual(r.usage.prompt_tokens, direct.final.usage.prompt_tokens);
      assert.strictEqual(r.usage.total_tokens, r.usage.prompt_tokens + 10);
    }],
    ['streaming chat: role chunk, same text, finish chunk, usage in the last chunk', async () => {
      const req = { model, messages: user('Stream to me.'), max_tokens: 12, temperature: 0,
                    ignore_eos: true };
      const whole = await client.chat.completions.create(req);
      const s = await h.collect(await client.chat.completions.create({
        ...req, stream: true, stream_options: { include_usage: true } }));
      const first = s.chunks[0];
      assert.strictEqual(first.object, 'chat.completion.chunk');
      assert.strictEqual(first.choices[0].delta.role, 'assistant');
      assert.strictEqual(s.text[0], whole.choices[0].message.content);
      assert.strictEqual(s.finish[0], 'length');
      const last = s.chunks[s.chunks.length - 1];
      assert.deepStrictEqual(last.choices, []);
      assert.deepStrictEqual(last.usage, whole.usage);
      for (const c of s.chunks.slice(0, -1)) assert.strictEqual(c.usage, null);
      assert.strictEqual(s.chunks[s.chunks.length - 2].choices[0].finish_reason, 'length');
      // Without include_usage no chunk carries usage.
      const plain = await h.collect(await client.chat.completions.create({ ...req, stream: true }));
      assert.strictEqual(plain.text[0], s.text[0]);
      assert.strictEqual(plain.usage, null);
      assert.ok(plain.chunks.every((c) => c.choices.length === 1 && c.usage === undefined));
    }],
    ['content-part arrays, developer and tool roles', async () => {
      const base = { model, max_tokens: 6, temperature: 0, ignore_eos: true };
      const parts = await client.chat.completions.create({ ...base, messages: [
        { role: 'developer', content: [{ type: 'text', text: 'Be' }, { type: 'text', text: 'brief.' }] },
        { role: 'user', content: 'What is 6 x 7?' },
        { role: 'assistant', content: 'Let me check.' },
        { role: 'tool', content: '42' }] });
      const direct = await h.generate(grpc, { chat: { messages: [
        { role: 'system', content: 'Be\nbrief.' }, { role: 'user', content: 'What is 6 x 7?' },
        { role: 'assistant', content: 'Let me check.' }, { role: 'tool', content: '42' }] },
        max_tokens: 6, sampling: { temperature: 0 }, ignore_eos: true });
      assert.strictEqual(parts.choices[0].message.content, direct.text);
    }],
    ['a stop sequence ends the text before it (string or list, streaming or not)', async () => {
      const req = { model, messages: user('abc'), max_tokens: 24, temperature: 0, ignore_eos: true };
      const text = (await client.chat.completions.create(req)).choices[0].message.content;
      assert.ok(text.length > 8, `generated too little text: ${JSON.stringify(text)}`);
      const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
      const want = text.slice(0, text.indexOf(stop));
      for (const s of [stop, ['#never#seen#', stop]]) {
        const r = await client.chat.completions.create({ ...req, stop: s });
        assert.strictEqual(r.choices[0].message.content, want);
        assert.strictEqual(r.choices[0].finish_reason, 'stop');
        const st = await h.collect(await client.chat.completions.create({ ...req, stop: s,
                                                                          stream: true }));
        assert.strictEqual(st.text[0], want);
        assert.strictEqual(st.finish[0], 'stop');
      }
    }],
    ['seeds reproduce (streaming or not); different seeds differ', async () => {
      const req = (seed) => ({ model, messages: user('Once upon a time'), max_tokens: 16,
                               temperature: 1, seed, ignore_eos: true });
      const a = (await client.chat.completions.create(req(7))).choices[0].message.content;
      const b = (await client.chat.completions.create(req(7))).choices[0].message.content;
      const s = await h.collect(await client.chat.completions.create({ ...req(7), stream: true }));
      const d = (await client.chat.completions.create(req(8))).choices[0].message.content;
      assert.strictEqual(a, b);
      assert.strictEqual(s.text[0], a);
      assert.notStrictEqual(a, d);
    }],
    ['n > 1: choices 0..n-1, choice i seeded seed + i, usage summed', async () => {
      const req = { model, messages: user('Tell me three things.'), max_tokens: 8,
                    temperature: 1, seed: 11, ignore_eos: true };
      const r = await client.chat.completions.create({ ...req, n: 3 });
      assert.deepStrictEqual(r.choices.map((c) => c.index), [0, 1, 2]);
      for (let i = 0; i < 3; i++) {
        const solo = await client.chat.completions.create({ ...req, seed: 11 + i });
        assert.strictEqual(r.choices[i].message.content, solo.choices[0].message.content, `choice ${i}`);
        if (i === 0) assert.strictEqual(r.usage.prompt_tokens, solo.usage.prompt_tokens);
      }
      assert.strictEqual(r.usage.completion_tokens, 24);
      const s = await h.collect(await client.chat.completions.create({
        ...req, n: 3, stream: true, stream_options: { include_usage: true } }));
      for (let i = 0; i < 3; i++) {
        assert.strictEqual(s.text[i], r.choices[i].message.content, `streamed choice ${i}`);
        assert.strictEqual(s.finish[i], 'length');
      }
      assert.deepStrictEqual(s.usage, r.usage);
    }],
    ['logprobs: top_logprobs alternatives, best first; greedy picks the best', async () => {
      const req = { model, messages: user('logprobs'), max_tokens: 4, temperature: 0,
                    ignore_eos: true, logprobs: true, top_logprobs: 3 };
      const r = await client.chat.completions.create(req);
      const content = r.choices[0].logprobs.content;
      assert.strictEqual(content.length, 4);
      for (const t of content) {
        assert.ok(t.logprob <= 0);
        assert.deepStrictEqual(t.bytes, [...Buffer.from(t.token, 'utf8')]);
        assert.strictEqual(t.top_logprobs.length, 3);
        assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob &&
                  t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob);
        assert.strictEqual(t.top_logprobs[0].token, t.token);
      }
      const s = await h.collect(await client.chat.completions.create({ ...req, stream: true }));
      const streamed = s.chunks.flatMap((c) => c.choices.flatMap((x) => (x.logprobs ? x.logprobs.content : [])));
      assert.deepStrictEqual(streamed.map((t) => t.token), content.map((t) => t.token));
      const none = await client.chat.completions.create({ ...req, logprobs: false, top_logprobs: undefined });
      assert.strictEqual(none.choices[0].logprobs, null);
    }],
    ['a request without max_tokens gets the default, at most the server\'s limit', async () => {
      const small = await h.startServer(['--limits.max_tokens', '12']);
      const gw2 = await h.startGateway(small);  // --default-max-tokens 4096
      const c2 = h.openai(gw2);
      const name = await h.modelName(c2);
      const r = await c2.chat.completions.create({ model: name, messages: user('Go on.'),
                                                   temperature: 0, ignore_eos: true });
      assert.strictEqual(r.choices[0].finish_reason, 'length');
      assert.strictEqual(r.usage.completion_tokens, 12);
      // Legacy completions default to 16 (OpenAI's), lowered the same way.
      const legacy = await c2.completions.create({ model: name, prompt: 'Go on.', temperature: 0,
                                                   ignore_eos: true });
      assert.strictEqual(legacy.usage.completion_tokens, 12);
      // A limit the client sets is still the server's to refuse, naming it.
      const e = await h.apiError(() => c2.chat.completions.create({ model: name,
        messages: user('Go on.'), max_completion_tokens: 13 }));
      assert.strictEqual(e.status, 400);
      assert.strictEqual(e.param, 'max_completion_tokens');
      await gw2.stop();
      await small.stop();
    }],
  ]);
  await gw.stop();
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
