// kimi-loadtest against a live kimi-server: a two-rate sweep produces a table, JSON and CSV with
// sane figures and no errors.
'use strict';
const assert = require('assert');
const fs = require('fs');
const path = require('path');
const { spawn, spawnSync } = require('child_process');
const h = require('../server/e2e/harness');

(async () => {
  const server = await h.startServer(['--memory.kv_cache_mib', '128']);
  const dir = h.tmpdir('kimi-loadtest-');
  await h.run([
    ['a two-rate sweep', async () => {
      const json = path.join(dir, 'out.json');
      const csv = path.join(dir, 'out.csv');
      const out = h.execFileSync(path.join(h.build, 'bin/kimi-loadtest'), [
        '--target', server.address(), '--rates', '2,4', '--duration', '3', '--requests', '12',
        '--warmup', '0.5', '--prompt_len', 'uniform:8:64', '--output_len', 'fixed:8',
        '--json', json, '--csv', csv], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
      assert.ok(out.includes('TTFT p50/p90/p99'), out);
      const r = JSON.parse(fs.readFileSync(json, 'utf8'));
      assert.strictEqual(r.levels.length, 2);
      for (const l of r.levels) {
        assert.ok(l.requests > 0 && l.succeeded === l.requests, JSON.stringify(l));
        assert.deepStrictEqual(l.errors, {});
        assert.ok(l.output_tokens_per_s > 0);
        assert.ok(l.ttft_s.p50 > 0 && l.ttft_s.p50 <= l.ttft_s.p90 && l.ttft_s.p90 <= l.ttft_s.p99);
        assert.ok(l.e2e_s.p50 >= l.ttft_s.p50);
      }
      const lines = fs.readFileSync(csv, 'utf8').trim().split('\n');
      assert.strictEqual(lines.length, 3);
      assert.ok(lines[0].startsWith('rate,requests_per_s'));
    }],
    ['--shared_prefix: every prompt starts with the same tokens, which the prefix cache serves', async () => {
      const saved = async () => h.metric(await h.scrape(server), 'kimi_prefix_cache_saved_tokens_total');
      const before = await saved();
      const json = path.join(dir, 'prefix.json');
      h.execFileSync(path.join(h.build, 'bin/kimi-loadtest'), [
        '--target', server.address(), '--rates', '8', '--duration', '1', '--requests', '6',
        '--warmup', '0', '--shared_prefix', '300', '--prompt_len', 'fixed:8', '--output_len',
        'fixed:4', '--json', json], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
      const r = JSON.parse(fs.readFileSync(json, 'utf8'));
      assert.strictEqual(r.shared_prefix, 300);
      const l = r.levels[0];
      assert.ok(l.requests > 1 && l.succeeded === l.requests, JSON.stringify(l));
      // The first request prefills the prefix; every other one restores its first 256 tokens
      // (the server's prefix_interval), those arriving meanwhile by waiting for its snapshot.
      assert.strictEqual(await saved() - before, 256 * (l.requests - 1));
    }],
    ['a TLS target (mutual TLS) with --tls_ca, --tls_cert and --tls_key', async () => {
      const certs = h.makeCerts(h.tmpdir('kimi-loadtest-tls-'));
      const file = (f) => path.join(certs.dir, f);
      const tls = await h.startServer(['--tls-cert', file('server.pem'), '--tls-key',
                                       file('server.key'), '--tls-client-ca', file('ca.pem')]);
      const bin = path.join(h.build, 'bin/kimi-loadtest');
      const run = (extra) => spawnSync(bin, [
        '--target', tls.address(), '--rates', '4', '--duration', '0.5', '--requests', '2',
        '--warmup', '0', '--prompt_len', 'fixed:8', '--output_len', 'fixed:2', '--json=-',
        ...extra], { encoding: 'utf8', timeout: 60000 });
      const ok = run(['--tls_ca', file('ca.pem'), '--tls_cert', file('client.pem'),
                      '--tls_key', file('client.key')]);
      assert.strictEqual(ok.status, 0, ok.stderr);
      const l = JSON.parse(ok.stdout).levels[0];
      assert.ok(l.requests > 0 && l.succeeded === l.requests, JSON.stringify(l));
      const plain = run([]);  // the server refuses the handshake
      assert.strictEqual(plain.status, 2, plain.stderr);
      assert.ok(plain.stderr.includes('cannot reach'), plain.stderr);
      const half = run(['--tls_cert', file('client.pem')]);
      assert.strictEqual(half.status, 2, half.stderr);
      assert.ok(half.stderr.includes('--tls_key'), half.stderr);
      await tls.stop();
    }],
    ['bad numbers and two stdout outputs are refused before the run', async () => {
      const bin = path.join(h.build, 'bin/kimi-loadtest');
      for (const args of [['--rates', 'nan'], ['--rates', 'inf'], ['--warmup', 'inf'],
                          ['--duration', 'nan'], ['--json=-', '--csv=-'],
                          ['--prompt_len', 'fixed:300000000'], ['--output_len', 'fixed:4294967299'],
                          ['--shared_prefix', '-1'], ['--shared_prefix', '200000000']]) {
        const r = spawnSync(bin, ['--target', server.address(), ...args], { encoding: 'utf8' });
        assert.strictEqual(r.status, 2, `${args.join(' ')}: ${r.status} ${r.stderr}`);
        assert.ok(r.stderr.includes('kimi-loadtest:'), r.stderr);
      }
    }],
    ['Ctrl-C writes the rates done and leaves no request running', async () => {
      const json = path.join(dir, 'interrupted.json');
      fs.writeFileSync(json, '{"previous": true}\n');
      const proc = spawn(path.join(h.build, 'bin/kimi-loadtest'), [
        '--target', server.address(), '--rates', '4,4', '--duration', '1.5', '--requests', '6',
        '--warmup', '0', '--prompt_len', 'fixed:16', '--output_len', 'fixed:400', '--json', json],
      { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      proc.stdout.on('data', (d) => { out += d; });
      proc.stderr.on('data', (d) => { out += d; });
      const exit = new Promise((resolve) => proc.on('exit', (code) => resolve(code)));
      // The first rate's row, then the signal while the second runs.
      await h.waitFor(async () => /\n\s+4\.00\s/.test(out), 60000, 'the first rate to finish');
      await new Promise((r) => setTimeout(r, 500));
      proc.kill('SIGINT');
      assert.strictEqual(await exit, 130, out);
      const r = JSON.parse(fs.readFileSync(json, 'utf8'));
      assert.strictEqual(r.levels.length, 1, JSON.stringify(r));
      assert.strictEqual(r.interrupted, true);
      await h.waitFor(async () => h.metric(await h.scrape(server), 'kimi_requests_running') === 0,
                      10000, 'the cancelled requests to leave the server');
    }],
    ['Ctrl-C before any rate finished still writes JSON (no levels, interrupted)', async () => {
      const json = path.join(dir, 'early.json');
      const proc = spawn(path.join(h.build, 'bin/kimi-loadtest'), [
        '--target', server.address(), '--rates', '4', '--duration', '1.5', '--requests', '6',
        '--warmup', '0', '--prompt_len', 'fixed:16', '--output_len', 'fixed:400', '--json', json],
      { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      proc.stderr.on('data', (d) => { out += d; });
      const exit = new Promise((resolve) => proc.on('exit', (code) => resolve(code)));
      await h.waitFor(async () => h.metric(await h.scrape(server), 'kimi_requests_running') > 0,
                      30000, 'the first requests to run');
      proc.kill('SIGINT');
      assert.strictEqual(await exit, 130, out);
      const r = JSON.parse(fs.readFileSync(json, 'utf8'));  // it was left empty
      assert.deepStrictEqual(r.levels, []);
      assert.strictEqual(r.interrupted, true);
      await h.waitFor(async () => h.metric(await h.scrape(server), 'kimi_requests_running') === 0,
                      10000, 'the cancelled requests to leave the server');
    }],
  ]);
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
