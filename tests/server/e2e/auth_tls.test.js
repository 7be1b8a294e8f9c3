// API keys (UNAUTHENTICATED without the right one), TLS, and mutual TLS, with certificates made by
// openssl at test time; broken TLS files are refused at start-up, naming the key (exit 2).
'use strict';
const assert = require('assert');
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');
const h = require('./harness');


const bearer = (key) => {
  const md = new h.grpc.Metadata();
  md.set('authorization', `Bearer ${key}`);
  return md;
};

(async () => {
  const dir = h.tmpdir('kimi-tls-');
  const certs = h.makeCerts(dir);
  fs.writeFileSync(path.join(dir, 'keys.txt'), '# keys\nsk-test-one\nsk-test-two\n');
  const tls = ['--tls-cert', path.join(dir, 'server.pem'), '--tls-key', path.join(dir, 'server.key')];
  const req = { text: 'secure', max_tokens: 3, sampling: { temperature: 0 } };

  await h.run([
    ['API keys: missing or wrong is UNAUTHENTICATED, right is served', async () => {
      const server = await h.startServer(['--api-keys-file', path.join(dir, 'keys.txt')]);
      const c = h.client(server);
      const none = await h.generate(c, req);
      assert.strictEqual(none.error.code, h.grpc.status.UNAUTHENTICATED);
      const wrong = await h.generate(c, req, bearer('sk-nope'));
      assert.strictEqual(wrong.error.code, h.grpc.status.UNAUTHENTICATED);
      const info = await h.unary(c, 'GetModelInfo', {});
      assert.strictEqual(info.err.code, h.grpc.status.UNAUTHENTICATED);
      const right = await h.generate(c, req, bearer('sk-test-two'));
      assert.strictEqual(right.status.code, 0, right.status.details);
      // Health stays open for probes.
      const hc = await h.unary(h.healthClient(server), 'Check', { service: '' });
      assert.strictEqual(hc.res.status, 'SERVING');
      const text = await h.scrape(server);
      assert.strictEqual(h.metric(text, 'kimi_auth_failures_total'), 3);
      await server.stop();
    }],
    ['TLS: a client trusting the CA is served; plaintext is refused', async () => {
      const server = await h.startServer(tls);
      const creds = h.grpc.credentials.createSsl(certs.ca);
      const r = await h.generate(h.client(server, creds), req);
      assert.strictEqual(r.status.code, 0, r.status.details);
      const plain = await h.generate(h.client(server), req, new h.grpc.Metadata(),
                                     { deadline: Date.now() + 3000 });
      assert.ok(plain.error, 'plaintext must not reach a TLS server');
      await server.stop();
    }],
    ['mutual TLS: only clients with a certificate from the CA', async () => {
      const server = await h.startServer([...tls, '--tls-client-ca', path.join(dir, 'ca.pem')]);
      const good = h.grpc.credentials.createSsl(certs.ca, certs.key, certs.cert);
      const r = await h.generate(h.client(server, good), req);
      assert.strictEqual(r.status.code, 0, r.status.details);
      for (const [name, creds] of [
        ['no client certificate', h.grpc.credentials.createSsl(certs.ca)],
        ['untrusted client certificate',
         h.grpc.credentials.createSsl(certs.ca, certs.rogueKey, certs.rogueCert)]]) {
        const bad = await h.generate(h.client(server, creds), req, new h.grpc.Metadata(),
                                     { deadline: Date.now() + 3000 });
        assert.ok(bad.error, `${name} was served`);
      }
      await server.stop();
    }],
    ['broken TLS files: exit 2 at start-up, naming the key and what is wrong', async () => {
      const file = (name, text) => {
        fs.writeFileSync(path.join(dir, name), text);
        return path.join(dir, name);
      };
      const garbage = file('garbage.txt', 'not a PEM file\n');
      const empty = file('empty.pem', '');
      fs.mkdirSync(path.join(dir, 'a-directory'), { recursive: true });
      const cert = path.join(dir, 'server.pem');
      const key = path.join(dir, 'server.key');
      const cases = [
        ['garbage key', [cert, garbage], 'tls.key_file', 'no PEM private key'],
        ['empty certificate', [empty, key], 'tls.cert_file', 'the file is empty'],
        ['key of another certificate', [cert, path.join(dir, 'client.key')], 'tls.key_file',
         'does not belong to the certificate'],
        ['a directory as the key', [cert, path.join(dir, 'a-directory')], 'tls.key_file',
         'is a directory'],
        ['garbage client CA', [cert, key, garbage], 'tls.client_ca_file', 'no PEM certificate'],
      ];
      for (const [name, [c, k, ca], wantKey, wantWhat] of cases) {
        const args = ['--model', h.modelDir, '--listen', '127.0.0.1:0', '--metrics-listen',
                      '127.0.0.1:0', '--tls-cert', c, '--tls-key', k];
        if (ca) args.push('--tls-client-ca', ca);
        const r = spawnSync(path.join(h.build, 'bin/kimi-server'), args,
                            { encoding: 'utf8', timeout: 30000 });
        const out = r.stdout + r.stderr;
        assert.strictEqual(r.status, 2, `${name}: exit ${r.status} ${r.signal}\n${out}`);
        assert.ok(out.includes(wantKey) && out.includes(wantWhat), `${name}:\n${out}`);
        assert.ok(!out.includes('cannot listen'), `${name}:\n${out}`);
      }
    }],
  ]);
})().catch((e) => { console.error(e); process.exit(1); });
