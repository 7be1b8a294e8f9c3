// Streaming generation through the real server: model info, tokenize round trip, greedy output
// equal to the engine's own argmax, seeds, many concurrent streams equal to solo runs, stop
// strings, logprobs, chat and token-id prompts, health and reflection.
'use strict';
const assert = require('assert');
const fs = require('fs');
const path = require('path');
const h = require('./harness');

// Reads `logits` [T, V] from a safetensors file written by kimi-logits.
function readLogits(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.slice(8, 8 + n).toString());
  const e = header.logits;
  const [begin, end] = e.data_offsets;
  const data = new Float32Array(buf.buffer.slice(buf.byteOffset + 8 + n + begin,
                                                 buf.byteOffset + 8 + n + end));
  return { rows: e.shape[0], vocab: e.shape[1], data };
}

(async () => {
  const server = await h.startServer();
  const c = h.client(server);
  const info = (await h.unary(c, 'GetModelInfo', {})).res;
  const numBase = info.vocab_size - 256;  // Kimi: 256 special ids after the base ranks

  await h.run([
    ['GetModelInfo describes the model', async () => {
      assert.strictEqual(info.model_type, 'kimi_k3');
      assert.ok(info.layer_kinds.includes('kda') && info.layer_kinds.includes('mla'));
      assert.ok(info.context_limit > 0);
      assert.strictEqual(info.tensor_parallel, 1);
      assert.strictEqual(info.max_tokens_limit, 4096);  // limits.max_tokens' default
    }],
    ['Tokenize and Detokenize round-trip', async () => {
      const text = 'Hello, world! 你好 👋';
      const t = (await h.unary(c, 'Tokenize', { text })).res;
      assert.ok(t.token_ids.length > 0);
      const d = (await h.unary(c, 'Detokenize', { token_ids: t.token_ids })).res;
      assert.strictEqual(d.text, text);
      assert.ok(Buffer.from(d.raw).equals(Buffer.from(text)));
      // A token holding part of a character: its own bytes in raw, U+FFFD in text.
      for (const id of t.token_ids) {
        const one = (await h.unary(c, 'Detokenize', { token_ids: [id] })).res;
        const raw = Buffer.from(one.raw);
        assert.ok(raw.length > 0);
        if (raw.toString('utf8') === one.text) continue;
        assert.ok(one.text.includes('\ufffd'), JSON.stringify(one.text));
      }
      const bad = await h.unary(c, 'Detokenize', { token_ids: [info.vocab_size] });
      assert.strictEqual(bad.err.code, h.grpc.status.INVALID_ARGUMENT);
      // skip_special_tokens leaves [EOS] (the second special id) out of text, as generated text
      // does; raw keeps its name.
      const eos = [t.token_ids[0], numBase + 1];
      const shown = (await h.unary(c, 'Detokenize', { token_ids: eos })).res;
      const skipped = (await h.unary(c, 'Detokenize', { token_ids: eos,
                                                        skip_special_tokens: true })).res;
      assert.ok(shown.text.endsWith('[EOS]'), shown.text);
      assert.strictEqual(skipped.text, shown.text.slice(0, -'[EOS]'.length));
      assert.ok(Buffer.from(skipped.raw).equals(Buffer.from(shown.raw)));
      // each_token: every id's own bytes and whether generated text leaves it out.
      const each = (await h.unary(c, 'Detokenize', { token_ids: eos, each_token: true })).res;
      assert.strictEqual(each.tokens.length, 2);
      const first = (await h.unary(c, 'Detokenize', { token_ids: [eos[0]] })).res;
      assert.ok(Buffer.from(each.tokens[0].raw).equals(Buffer.from(first.raw)));
      assert.strictEqual(Buffer.from(each.tokens[1].raw).toString(), '[EOS]');
      assert.deepStrictEqual(each.tokens.map((x) => x.special), [false, true]);
    }],
    ['greedy streaming equals the engine argmax, token by token', async () => {
      const prompt = 'The quick brown fox';
      const r = await h.generate(c, { text: prompt, max_tokens: 12, sampling: { temperature: 0 },
                                      ignore_eos: true });
      assert.strictEqual(r.status.code, 0, r.status.details);
      assert.strictEqual(r.tokens.length, 12);
      assert.strictEqual(r.final.finish_reason, 'FINISH_REASON_LENGTH');
      const ids = (await h.unary(c, 'Tokenize', { text: prompt, add_special_tokens: true }))
                      .res.token_ids;
      assert.strictEqual(r.final.usage.prompt_tokens, ids.length);
      assert.strictEqual(r.final.usage.completion_tokens, 12);
      // The server prefilled the prompt in one chunk, then decoded one token per step.
      const all = ids.concat(r.tokens.slice(0, -1));
      const chunks = [ids.length].concat(Array(r.tokens.length - 1).fill(1));
      const out = path.join(h.tmpdir('kimi-logits-'), 'l.safetensors');
      h.execFileSync(path.join(h.build, 'bin/kimi-logits'),
                     ['--model', h.modelDir, '--tokens', all.join(','), '--chunks',
                      chunks.join(','), '--out', out]);
      const l = readLogits(out);
      for (let i = 0; i < r.tokens.length; i++) {
        const row = l.data.subarray((ids.length - 1 + i) * l.vocab, (ids.length + i) * l.vocab);
        let best = 0;
        for (let v = 1; v < l.vocab; v++) if (row[v] > row[best]) best = v;
        assert.strictEqual(r.tokens[i], best, `token ${i}`);
      }
      // The streamed text is the decoded ids (special tokens are not text).
      const ordinary = r.tokens.filter((t) => t < numBase);
      const d = (await h.unary(c, 'Detokenize', { token_ids: ordinary })).res;
      assert.strictEqual(r.text, d.text);
    }],
    ['seeds reproduce; different seeds differ', async () => {
      const req = (seed) => ({ text: 'Once upon a time', max_tokens: 16, ignore_eos: true,
                               sampling: { temperature: 1.0, seed } });
      const a = await h.generate(c, req(7));
      const b = await h.generate(c, req(7));
      const d = await h.generate(c, req(8));
      assert.deepStrictEqual(a.tokens, b.tokens);
      assert.notDeepStrictEqual(a.tokens, d.tokens);
    }],
    ['many concurrent streams each equal their solo run', async () => {
      const reqs = [];
      for (let i = 0; i < 24; i++) {
        reqs.push({ text: `Request number ${i}: ` + 'lorem ipsum '.repeat(i % 7),
                    max_tokens: 8 + (i % 5) * 4, ignore_eos: true,
                    sampling: { temperature: i % 3 === 0 ? 0 : 0.8, top_p: i % 2 ? 0.9 : 1,
                                top_k: i % 4 === 1 ? 50 : 0, seed: 100 + i,
                                presence_penalty: i % 5 === 2 ? 0.5 : 0 } });
      }
      const solo = [];
      for (const r of reqs) solo.push(await h.generate(c, r));
      const together = await Promise.all(reqs.map((r) => h.generate(c, r)));
      for (let i = 0; i < reqs.length; i++) {
        assert.strictEqual(together[i].status.code, 0, together[i].status.details);
        assert.ok(together[i].final, `stream ${i} ended without a finish reason`);
        assert.deepStrictEqual(together[i].tokens, solo[i].tokens, `stream ${i}`);
        assert.strictEqual(together[i].text, solo[i].text);
      }
    }],
    ['a stop string ends the stream before it', async () => {
      const base = await h.generate(c, { text: 'abc', max_tokens: 24, ignore_eos: true,
                                         sampling: { temperature: 0 } });
      const text = base.text;
      assert.ok(text.length > 8, `generated too little text: ${JSON.stringify(text)}`);
      const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
      const r = await h.generate(c, { text: 'abc', max_tokens: 24, ignore_eos: true,
                                      sampling: { temperature: 0 }, stop: [stop] });
      assert.strictEqual(r.final.finish_reason, 'FINISH_REASON_STOP');
      assert.strictEqual(r.text, text.slice(0, text.indexOf(stop)));
      assert.ok(!r.text.includes(stop));
    }],
    ['a stop token id ends the stream with its id but without its text', async () => {
      const base = await h.generate(c, { text: 'abc', max_tokens: 24, ignore_eos: true,
                                         sampling: { temperature: 0 } });
      // The first token that has text of its own and does not come earlier.
      let at = -1;
      for (let i = 1; i < base.tokens.length && at < 0; ++i) {
        const own = (await h.unary(c, 'Detokenize', { token_ids: [base.tokens[i]] })).res.text;
        if (own.length > 0 && !base.tokens.slice(0, i).includes(base.tokens[i])) at = i;
      }
      assert.ok(at > 0, 'no usable stop token in the greedy output');
      const r = await h.generate(c, { text: 'abc', max_tokens: 24, ignore_eos: true,
                                      sampling: { temperature: 0 },
                                      stop_token_ids: [base.tokens[at]] });
      assert.strictEqual(r.final.finish_reason, 'FINISH_REASON_STOP');
      assert.deepStrictEqual(r.tokens, base.tokens.slice(0, at + 1));
      const before = (await h.unary(c, 'Detokenize', { token_ids: base.tokens.slice(0, at) })).res;
      assert.strictEqual(r.text, before.text);
    }],
    ['a stop string the last allowed token completes finishes with STOP', async () => {
      const base = await h.generate(c, { text: 'abc', max_tokens: 24, ignore_eos: true,
                                         sampling: { temperature: 0 } });
      // The first k tokens' text ends in a (plain ASCII) stop string found nowhere before it.
      let k = 0, stop = '', upto = '';
      for (let n = 8; n <= 24 && !stop; n++) {
        const t = (await h.unary(c, 'Detokenize', { token_ids: base.tokens.slice(0, n) })).res.text;
        const s = t.slice(-2);
        if (/^[ -~]{2}$/.test(s) && t.indexOf(s) === t.length - 2) [k, stop, upto] = [n, s, t];
      }
      assert.ok(stop, `no usable stop string in ${JSON.stringify(base.text)}`);
      const r = await h.generate(c, { text: 'abc', max_tokens: k, ignore_eos: true,
                                      sampling: { temperature: 0 }, stop: [stop] });
      assert.strictEqual(r.final.finish_reason, 'FINISH_REASON_STOP');
      assert.strictEqual(r.text, upto.slice(0, -2));
    }],
    ['logprobs: chosen token and top-n, best first', async () => {
      const r = await h.generate(c, { text: 'logprobs', max_tokens: 4, logprobs: 3,
                                      sampling: { temperature: 0 }, ignore_eos: true });
      const lps = r.messages.flatMap((m) => m.logprobs);
      assert.strictEqual(lps.length, 4);
      for (const lp of lps) {
        assert.strictEqual(lp.top.length, 3);
        assert.ok(lp.logprob <= 0);
        assert.ok(lp.top[0].logprob >= lp.top[1].logprob && lp.top[1].logprob >= lp.top[2].logprob);
        assert.strictEqual(lp.top[0].token_id, lp.token_id);  // greedy: the best is chosen
      }
    }],
    ['chat and token-id prompts', async () => {
      const chat = await h.generate(c, { chat: { messages: [
        { role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Hi!' }] },
        max_tokens: 5, sampling: { temperature: 0 } });
      assert.strictEqual(chat.status.code, 0, chat.status.details);
      assert.ok(chat.final.usage.prompt_tokens > 4);
      const ids = await h.generate(c, { token_ids: { ids: [1, 2, 3, 4] }, max_tokens: 3,
                                        sampling: { temperature: 0 }, ignore_eos: true });
      assert.strictEqual(ids.final.usage.prompt_tokens, 4);
      assert.strictEqual(ids.tokens.length, 3);
    }],
    ['the request log keeps one line per request, whatever the client id holds', async () => {
      const forged = 'a"\n2026-01-01T00:00:00.000 warn FORGED';
      const r = await h.generate(c, { text: 'Hi', max_tokens: 2, request_id: forged });
      assert.strictEqual(r.status.code, 0, r.status.details);
      await h.waitFor(async () => server.log.includes('client_id="a\\"\\n2026'), 5000,
                      'the escaped client id in the request log');
      assert.ok(!/^2026-01-01T00:00:00.000 warn FORGED/m.test(server.log), server.log);
    }],
    ['--kda-state-dtype bf16 serves with smaller KDA state slots, seeds reproducing', async () => {
      const slotBytes = (log) => Number(log.match(/KDA state slots \((\d+) B each, (\w+) state\)/)[1]);
      assert.match(server.log, /KDA state slots \(\d+ B each, fp32 state\)/);
      const bf16 = await h.startServer(['--kda-state-dtype', 'bf16']);
      try {
        assert.match(bf16.log, /KDA state slots \(\d+ B each, bf16 state\)/);
        // Half the recurrent state; the conv history, a large part of k3-tiny's, stays fp32.
        assert.ok(slotBytes(bf16.log) < slotBytes(server.log) &&
                  slotBytes(bf16.log) > slotBytes(server.log) / 2,
                  `${slotBytes(bf16.log)} against ${slotBytes(server.log)}`);
        const bc = h.client(bf16);
        const req = { text: 'Once upon a time', max_tokens: 16, ignore_eos: true,
                      sampling: { temperature: 1.0, seed: 7 } };
        const a = await h.generate(bc, req);
        const b = await h.generate(bc, req);
        assert.strictEqual(a.status.code, 0, a.status.details);
        assert.strictEqual(a.tokens.length, 16);
        assert.deepStrictEqual(a.tokens, b.tokens);
      } finally {
        await bf16.stop();
      }
    }],
    ['a second server on the port in use fails to start', async () => {
      // Without SO_REUSEPORT off, gRPC let it bind and split the port's connections between two.
      const second = h.startServer(['--listen', server.address()], { waitServing: false });
      await assert.rejects(second, /cannot listen on 127\.0\.0\.1:\d+ \(address in use/);
    }],
    ['health reports SERVING; reflection lists the services', async () => {
      const hc = h.healthClient(server);
      for (const service of ['', 'kimi.v1.Generation']) {
        const r = await h.unary(hc, 'Check', { service });
        assert.strictEqual(r.res.status, 'SERVING', service);
      }
      const rc = h.reflectionClient(server);
      const call = rc.ServerReflectionInfo();
      const replies = [];
      await new Promise((resolve, reject) => {
        call.on('data', (m) => { replies.push(m); if (replies.length === 2) call.end(); });
        call.on('end', resolve);
        call.on('error', reject);
        call.write({ list_services: '' });
        call.write({ file_containing_symbol: 'kimi.v1.Generation' });
      });
      const names = replies[0].list_services_response.service.map((s) => s.name);
      assert.ok(names.includes('kimi.v1.Generation'), names.join(','));
      assert.ok(names.includes('grpc.health.v1.Health'), names.join(','));
      const fd = replies[1].file_descriptor_response.file_descriptor_proto;
      assert.ok(fd.length > 0 && Buffer.from(fd[0]).toString('latin1').includes('GenerateRequest'));
    }],
  ]);
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
