// Every bad input gets INVALID_ARGUMENT naming the field and its range; a full queue gets
// RESOURCE_EXHAUSTED; nothing crashes or hangs, and the server keeps serving afterwards.
'use strict';
const assert = require('assert');
const { spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');
const h = require('./harness');

(async () => {
  const server = await h.startServer(['--max-context', '64', '--batching.max_waiting', '2',
                                      '--batching.max_running', '1']);
  const c = h.client(server);
  const INVALID = h.grpc.status.INVALID_ARGUMENT;
  const expectInvalid = async (request, field) => {
    const r = await h.generate(c, request);
    assert.ok(r.error, `accepted: ${JSON.stringify(request)}`);
    assert.strictEqual(r.error.code, INVALID, r.error.message);
    assert.ok(r.error.details.startsWith(field), `"${r.error.details}" should name ${field}`);
    return r.error.details;
  };
  const ok = { text: 'hi', max_tokens: 4 };
  await h.run([
    ['empty and missing prompts', async () => {
      await expectInvalid({ max_tokens: 4 }, 'prompt: one of text, token_ids or chat');
      await expectInvalid({ text: '', max_tokens: 4 }, 'text: must not be empty');
      await expectInvalid({ token_ids: { ids: [] }, max_tokens: 4 }, 'token_ids.ids');
      await expectInvalid({ chat: { messages: [] }, max_tokens: 4 }, 'chat.messages');
    }],
    ['prompt longer than the context', async () => {
      const d = await expectInvalid({ text: 'word '.repeat(200), max_tokens: 4 }, 'prompt:');
      assert.ok(d.includes('context limit is 64'), d);
    }],
    ['max_tokens 0 or too large', async () => {
      await expectInvalid({ text: 'hi', max_tokens: 0 }, 'max_tokens: must be in [1, 4096]');
      await expectInvalid({ text: 'hi', max_tokens: 100000 }, 'max_tokens: must be in [1, 4096]');
    }],
    ['sampling ranges', async () => {
      await expectInvalid({ ...ok, sampling: { temperature: -1 } }, 'sampling.temperature');
      await expectInvalid({ ...ok, sampling: { top_p: 0 } }, 'sampling.top_p: must be in (0, 1]');
      await expectInvalid({ ...ok, sampling: { top_p: 1.01 } }, 'sampling.top_p');
      await expectInvalid({ ...ok, sampling: { min_p: 3 } }, 'sampling.min_p');
      await expectInvalid({ ...ok, sampling: { frequency_penalty: 9 } }, 'sampling.frequency_penalty');
      await expectInvalid({ ...ok, sampling: { repetition_penalty: 50 } }, 'sampling.repetition_penalty');
    }],
    ['unknown token ids', async () => {
      await expectInvalid({ token_ids: { ids: [1, 2, 4000000] }, max_tokens: 4 },
                          'token_ids.ids[2]: 4000000 is not a token id');
      await expectInvalid({ ...ok, stop_token_ids: [4000000] }, 'stop_token_ids[0]');
    }],
    ['invalid UTF-8 in text, chat content and stop strings', async () => {
      // A lone surrogate is encoded by protobufjs as the 3 bytes ED A0 80: not UTF-8.
      const bad = 'ok \ud800 bad';
      await expectInvalid({ text: bad, max_tokens: 4 }, 'text: not valid UTF-8');
      await expectInvalid({ chat: { messages: [{ role: 'user', content: bad }] }, max_tokens: 4 },
                          'chat.messages[0].content: not valid UTF-8');
      await expectInvalid({ ...ok, stop: [bad] }, 'stop[0]: not valid UTF-8');
      const t = await h.unary(c, 'Tokenize', { text: bad });
      assert.strictEqual(t.err.code, INVALID);
    }],
    ['too many or too long stop strings, too many logprobs, bad roles', async () => {
      await expectInvalid({ ...ok, stop: Array(9).fill('x') }, 'stop: at most 8');
      await expectInvalid({ ...ok, stop: ['y'.repeat(300)] }, 'stop[0]: at most 256 bytes');
      await expectInvalid({ ...ok, logprobs: 50 }, 'logprobs: must be in [0, 20]');
      await expectInvalid({ chat: { messages: [{ role: 'wizard', content: 'x' }] }, max_tokens: 4 },
                          'chat.messages[0].role');
    }],
    ['a full queue is RESOURCE_EXHAUSTED', async () => {
      // One running slot, two waiting: the rest of a burst is refused, never lost or hung.
      const burst = await Promise.all(Array.from({ length: 12 }, (_, i) =>
        h.generate(c, { text: `burst ${i}`, max_tokens: 200, ignore_eos: true })));
      const codes = burst.map((r) => (r.error ? r.error.code : 0));
      const refused = burst.filter((r) => r.error && r.error.code === h.grpc.status.RESOURCE_EXHAUSTED);
      // At an idle server: one starts (the free slot), two wait, nine are refused.
      assert.strictEqual(refused.length, 9, `codes: ${codes}`);
      assert.ok(refused[0].error.details.includes('queue full'), refused[0].error.details);
      for (const r of burst) {
        assert.ok(r.error ? r.error.code === h.grpc.status.RESOURCE_EXHAUSTED : r.final,
                  `every request either finishes or is refused: ${codes}`);
      }
    }],
    ['a request over server.max_request_bytes is refused', async () => {
      const r = await h.generate(c, { text: 'x'.repeat(5 << 20), max_tokens: 1 });
      assert.ok(r.error);
      assert.strictEqual(r.error.code, h.grpc.status.RESOURCE_EXHAUSTED, r.error.message);
    }],
    ['while the model loads: NOT_SERVING and UNAVAILABLE', async () => {
      const loading = await h.startServer([], { waitServing: false,
                                                env: { KIMI_TEST_LOAD_DELAY_MS: '1500' } });
      const r = await h.generate(h.client(loading), ok);
      assert.strictEqual(r.error && r.error.code, h.grpc.status.UNAVAILABLE);
      assert.ok(r.error.details.includes('loading'), r.error.details);
      const hc = await h.unary(h.healthClient(loading), 'Check', { service: '' });
      assert.strictEqual(hc.res.status, 'NOT_SERVING');
      await h.waitFor(() => loading.log.includes('SERVING '), 20000, 'SERVING');
      const later = await h.generate(h.client(loading), ok);
      assert.strictEqual(later.status.code, 0, later.status.details);
      await loading.stop();
    }],
    ['a tokenizer with ids past the model\'s vocabulary is refused at start-up', async () => {
      // The model's files linked, its tokenizer_config.json with one added token past vocab_size:
      // it loaded, and a prompt holding that token failed as an internal error.
      const dir = h.tmpdir('kimi-vocab-');
      for (const f of fs.readdirSync(h.modelDir)) {
        if (f !== 'tokenizer_config.json') fs.symlinkSync(path.join(h.modelDir, f), path.join(dir, f));
      }
      const cfg = JSON.parse(fs.readFileSync(path.join(h.modelDir, 'tokenizer_config.json'), 'utf8'));
      cfg.added_tokens_decoder['100000000'] = { content: '<|x|>', special: true };
      fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
      const r = spawnSync(path.join(h.build, 'bin/kimi-server'),
                          ['--model', dir, '--listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0'],
                          { encoding: 'utf8', timeout: 60000 });
      assert.strictEqual(r.status, 1, r.stderr + r.stdout);
      assert.ok(/the tokenizer has 100000001 ids .* vocab_size is \d+/.test(r.stderr + r.stdout),
                r.stderr + r.stdout);
    }],
    ['the server still serves', async () => {
      const r = await h.generate(c, ok);
      assert.strictEqual(r.status.code, 0, r.status.details);
    }],
  ]);
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
