// kimi-gateway in front of a kimi-server with TLS on (mutual TLS: the server asks for a client
// certificate): with the CA and its own certificate the gateway serves; without them the backend
// refuses it (503); unreadable or non-PEM files stop the gateway at start-up naming the flag.
'use strict';
const assert = require('assert');
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');
const h = require('./harness');

(async () => {
  const dir = h.tmpdir('kimi-gw-tls-');
  h.makeCerts(dir);
  const file = (f) => path.join(dir, f);
  const server = await h.startServer(['--tls-cert', file('server.pem'), '--tls-key',
                                      file('server.key'), '--tls-client-ca', file('ca.pem')]);
  await h.run([
    ['with the CA and a client certificate the gateway serves a TLS backend', async () => {
      const gw = await h.startGateway(server, [
        '--backend-ca-file', file('ca.pem'), '--backend-cert-file', file('client.pem'),
        '--backend-key-file', file('client.key')]);
      await h.waitFor(async () => (await h.request(gw, 'GET', '/health')).status === 200, 10000,
                      '/health 200');
      const client = h.openai(gw);
      const r = await client.chat.completions.create({
        model: await h.modelName(client), messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 4, temperature: 0, ignore_eos: true });
      assert.strictEqual(r.usage.completion_tokens, 4);
      await gw.stop();
    }],
    ['without its certificate, or without TLS, the backend refuses the gateway: 503', async () => {
      for (const args of [['--backend-ca-file', file('ca.pem')], []]) {
        const gw = await h.startGateway(server, args);
        const health = await h.request(gw, 'GET', '/health');
        assert.strictEqual(health.status, 503, `${args}: ${health.text}`);
        assert.strictEqual(health.body.error.code, 'service_unavailable');
        await gw.stop();
      }
    }],
    ['unreadable or non-PEM files, and a certificate without its key, stop it at start-up', async () => {
      fs.writeFileSync(file('not.pem'), 'hello\n');
      const bin = path.join(h.build, 'bin/kimi-gateway');
      for (const [args, named] of [
        [['--backend-ca-file', file('missing.pem')], '--backend-ca-file'],
        [['--backend-ca-file', file('not.pem')], '--backend-ca-file'],
        [['--backend-ca-file', file('ca.pem'), '--backend-cert-file', file('client.pem')],
         '--backend-key-file'],
        [['--backend-cert-file', file('client.pem'), '--backend-key-file', file('client.key')],
         '--backend-ca-file']]) {
        const r = spawnSync(bin, ['--backend', server.address(), '--listen', '127.0.0.1:0', ...args],
                            { encoding: 'utf8', timeout: 20000 });
        const out = r.stdout + r.stderr;  // flags on stderr, start-up errors in the log (stdout)
        assert.strictEqual(r.status, 2, `${args.join(' ')}: ${r.status} ${out}`);
        assert.ok(out.includes(named), out);
      }
    }],
  ]);
  await server.stop();
})().catch((e) => { console.error(e); process.exit(1); });
