// A live scrape passes Prometheus's own checker (promtool), carries the documented families, and
// has every series the Grafana dashboard queries.
'use strict';
const assert = require('assert');
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');
const h = require('./harness');

(async () => {
  const server = await h.startServer();
  const fresh = await h.scrape(server);  // after the server's own warm-up request, before any client's
  const c = h.client(server);
  await Promise.all(Array.from({ length: 4 }, (_, i) =>
    h.generate(c, { text: `metrics ${i}`, max_tokens: 10, sampling: { temperature: 0 } })));
  const bad = await h.generate(c, { text: '', max_tokens: 1 });
  assert.ok(bad.error);
  const text = await h.scrape(server);
  await h.run([
    ['promtool check metrics accepts the scrape', async () => {
      const r = spawnSync('promtool', ['check', 'metrics'], { input: text });
      assert.ok(!r.error, 'promtool missing: run ./scripts/test.sh (installs Debian prometheus)');
      // promtool exits 3 for lint warnings only; 1 for errors.
      assert.ok(r.status === 0 || r.status === 3,
                `promtool failed (${r.status}): ${r.stdout}${r.stderr}`);
      const lint = `${r.stdout}${r.stderr}`.split('\n').filter((l) => l.includes('kimi_'));
      assert.deepStrictEqual(lint, [], `lint on kimi_ metrics:\n${lint.join('\n')}`);
    }],
    ['the warm-up request counts nothing: a fresh server shows no steps', async () => {
      for (const series of ['kimi_step_duration_seconds_count', 'kimi_batch_size_count',
                            'kimi_step_tokens_total{phase="prefill"}',
                            'kimi_step_tokens_total{phase="decode"}',
                            'kimi_prefix_cache_queries_total', 'kimi_requests_running']) {
        assert.strictEqual(h.metric(fresh, series), 0, series);
      }
    }],
    ['request, token and latency metrics moved', async () => {
      assert.ok(h.metric(text, 'kimi_requests_total{finish_reason="length"}') +
                h.metric(text, 'kimi_requests_total{finish_reason="stop"}') >= 4);
      assert.ok(h.metric(text, 'kimi_generation_tokens_total') >= 4);
      assert.ok(h.metric(text, 'kimi_time_to_first_token_seconds_count') >= 4);
      assert.ok(h.metric(text, 'kimi_inter_token_latency_seconds_count') >= 4);
      assert.ok(h.metric(text, 'kimi_step_duration_seconds_count') >= 1);
      assert.ok(h.metric(text, 'kimi_requests_rejected_total{code="INVALID_ARGUMENT"}') >= 1);
      assert.ok(h.metric(text, 'kimi_kda_state_slots{state="total"}') > 0);
      assert.ok(h.metric(text, 'kimi_mla_kv_pages{state="total"}') > 0);
      // Idle: every page still used is the prefix cache's alone.
      assert.strictEqual(h.metric(text, 'kimi_mla_kv_pages{state="cached"}'),
                         h.metric(text, 'kimi_mla_kv_pages{state="used"}'));
      assert.ok(h.metric(text, 'kimi_attn_res_cache_bytes{state="total"}') > 0);
      // Idle after the requests: nothing holds a slot, a page or the block cache.
      for (const series of ['kimi_requests_running', 'kimi_kda_state_slots{state="used"}',
                            'kimi_mla_kv_pages{state="used"}',
                            'kimi_attn_res_cache_bytes{state="used"}']) {
        assert.strictEqual(h.metric(text, series), 0, series);
      }
    }],
    ['every series the dashboard queries exists', async () => {
      const dash = fs.readFileSync(path.join(h.root, 'deploy/grafana/kimi-serve.json'), 'utf8');
      const names = new Set(dash.match(/kimi_[a-z0-9_]+/g));
      assert.ok(names.size > 10);
      for (const n of names) {
        assert.ok(new RegExp(`^${n}[ {]`, 'm').test(text), `${n} is queried but not exported`);
      }
    }],
  ]);
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
