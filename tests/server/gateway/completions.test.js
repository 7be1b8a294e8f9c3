// Legacy completions through kimi-gateway with the official openai client: text equal to the
// server's, OpenAI's default max_tokens, streaming with usage, lists of prompts and token-id
// prompts, stop sequences, seeds and legacy logprobs.
'use strict';
const assert = require('assert');
const h = require('./harness');

(async () => {
  const server = await h.startServer();
  const gw = await h.startGateway(server);
  const client = h.openai(gw);
  const grpc = h.client(server);
  const model = await h.modelName(client);

  await h.run([
    ['non-streaming completion equals the server\'s answer to the same text', async () => {
      const prompt = 'The quick brown fox';
      const r = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0,
                                                  ignore_eos: true });
      assert.strictEqual(r.object, 'text_completion');
      assert.match(r.id, /^cmpl-/);
      assert.strictEqual(r.choices.length, 1);
      assert.strictEqual(r.choices[0].finish_reason, 'length');
      assert.strictEqual(r.choices[0].logprobs, null);
      const direct = await h.generate(grpc, { text: prompt, max_tokens: 12,
                                              sampling: { temperature: 0 }, ignore_eos: true });
      assert.strictEqual(r.choices[0].text, direct.text);
      assert.deepStrictEqual(r.usage, { prompt_tokens: direct.final.usage.prompt_tokens,
                                        completion_tokens: 12,
                                        total_tokens: direct.final.usage.prompt_tokens + 12 });
    }],
    ['max_tokens defaults to 16, as OpenAI\'s', async () => {
      const r = await client.completions.create({ model, prompt: 'default', ignore_eos: true });
      assert.strictEqual(r.usage.completion_tokens, 16);
      assert.strictEqual(r.choices[0].finish_reason, 'length');
    }],
    ['streaming completion: same text, finish chunk, usage last', async () => {
      const req = { model, prompt: 'Stream me', max_tokens: 10, temperature: 0, ignore_eos: true };
      const whole = await client.completions.create(req);
      const s = await h.collect(await client.completions.create({
        ...req, stream: true, stream_options: { include_usage: true } }));
      assert.strictEqual(s.chunks[0].object, 'text_completion');
      assert.strictEqual(s.text[0], whole.choices[0].text);
      assert.strictEqual(s.finish[0], 'length');
      const last = s.chunks[s.chunks.length - 1];
      assert.deepStrictEqual(last.choices, []);
      assert.deepStrictEqual(last.usage, whole.usage);
    }],
    ['a list of prompts times n: choices ordered prompt by prompt', async () => {
      const req = { model, max_tokens: 6, temperature: 1, seed: 5, ignore_eos: true };
      const r = await client.completions.create({ ...req, prompt: ['First prompt', 'Second'], n: 2 });
      assert.deepStrictEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
      let prompt = 0;
      for (const [i, p] of [[0, 'First prompt'], [1, 'First prompt'], [2, 'Second'], [3, 'Second']]) {
        const solo = await client.completions.create({ ...req, prompt: p, seed: 5 + (i % 2) });
        assert.strictEqual(r.choices[i].text, solo.choices[0].text, `choice ${i}`);
        if (i % 2 === 0) prompt += solo.usage.prompt_tokens;
      }
      assert.strictEqual(r.usage.prompt_tokens, prompt);  // each prompt once
      assert.strictEqual(r.usage.completion_tokens, 24);
    }],
    ['token-id prompts, one or many', async () => {
      const one = await client.completions.create({ model, prompt: [1, 2, 3, 4], max_tokens: 3,
                                                    temperature: 0, ignore_eos: true });
      assert.strictEqual(one.usage.prompt_tokens, 4);
      const direct = await h.generate(grpc, { token_ids: { ids: [1, 2, 3, 4] }, max_tokens: 3,
                                              sampling: { temperature: 0 }, ignore_eos: true });
      assert.strictEqual(one.choices[0].text, direct.text);
      const many = await client.completions.create({ model, prompt: [[1, 2], [3, 4, 5]],
                                                     max_tokens: 2, ignore_eos: true });
      assert.strictEqual(many.choices.length, 2);
      assert.strictEqual(many.usage.prompt_tokens, 5);
    }],
    ['a stop sequence ends the text before it', async () => {
      const req = { model, prompt: 'abc', max_tokens: 24, temperature: 0, ignore_eos: true };
      const text = (await client.completions.create(req)).choices[0].text;
      assert.ok(text.length > 8, `generated too little text: ${JSON.stringify(text)}`);
      const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
      const r = await client.completions.create({ ...req, stop: [stop] });
      assert.strictEqual(r.choices[0].text, text.slice(0, text.indexOf(stop)));
      assert.strictEqual(r.choices[0].finish_reason, 'stop');
      const s = await h.collect(await client.completions.create({ ...req, stop, stream: true }));
      assert.strictEqual(s.text[0], r.choices[0].text);
      assert.strictEqual(s.finish[0], 'stop');
    }],
    ['seeds reproduce; different seeds differ', async () => {
      const req = (seed) => ({ model, prompt: 'Once upon a time', max_tokens: 16, temperature: 1,
                               seed, ignore_eos: true });
      const a = (await client.completions.create(req(3))).choices[0].text;
      const b = (await client.completions.create(req(3))).choices[0].text;
      const d = (await client.completions.create(req(4))).choices[0].text;
      assert.strictEqual(a, b);
      assert.notStrictEqual(a, d);
    }],
    ['legacy logprobs: tokens, token_logprobs, top_logprobs, text_offset', async () => {
      const r = await client.completions.create({ model, prompt: 'logprobs', max_tokens: 5,
                                                  temperature: 0, ignore_eos: true, logprobs: 2 });
      const lp = r.choices[0].logprobs;
      assert.strictEqual(lp.tokens.length, 5);
      assert.strictEqual(lp.token_logprobs.length, 5);
      assert.strictEqual(lp.top_logprobs.length, 5);
      assert.strictEqual(lp.text_offset[0], 0);
      for (let i = 0; i < 5; i++) {
        assert.ok(lp.token_logprobs[i] <= 0);
        const top = Object.entries(lp.top_logprobs[i]);
        assert.ok(top.length >= 1 && top.length <= 2);
        // Greedy: the chosen token is the best alternative.
        assert.ok(Math.max(...top.map(([, v]) => v)) <= lp.token_logprobs[i] + 1e-6);
        if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
      }
    }],
  ]);
  await gw.stop();
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
