// Shared by the end-to-end tests: start kimi-server on free ports, clients for kimi.v1, health and
// reflection, a tiny test runner with per-test time limits, and /metrics scraping.
'use strict';
const { spawn, execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const http = require('http');

const root = process.env.KIMI_SOURCE_DIR || path.resolve(__dirname, '../../..');
const build = process.env.KIMI_BUILD_DIR || path.join(root, 'build');
const modelDir = process.env.KIMI_MODEL || path.join(root, 'models/k3-tiny');
const nodeModules = path.join(root, 'node_modules');

function need(mod) {
  try {
    return require(path.join(nodeModules, mod));
  } catch (e) {
    console.error(`missing npm package ${mod}: run ./scripts/test.sh (it installs the test clients)`);
    process.exit(1);
  }
}
const grpc = need('@grpc/grpc-js');
const loader = need('@grpc/proto-loader');

const loadOpts = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };
const kimi = grpc.loadPackageDefinition(
  loader.loadSync(path.join(root, 'proto/kimi/v1/generation.proto'), loadOpts)).kimi.v1;
const health = grpc.loadPackageDefinition(
  loader.loadSync(path.join(__dirname, 'health.proto'), loadOpts)).grpc.health.v1;
const reflection = grpc.loadPackageDefinition(
  loader.loadSync(path.join(__dirname, 'reflection.proto'), loadOpts)).grpc.reflection.v1alpha;

if (!fs.existsSync(path.join(modelDir, 'config.json'))) {
  console.error(`model ${modelDir} missing: run ./scripts/test.sh (the set-up generates it)`);
  process.exit(1);
}

// Starts kimi-server; resolves once it reports SERVING. Extra args go to the command line.
function startServer(args = [], { waitServing = true, env = {}, launcher = [] } = {}) {
  return new Promise((resolve, reject) => {
    const argv = ['--model', modelDir, '--listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0',
                  '--batching.page_size', '16', '--memory.kv_cache_mib', '64',
                  '--memory.kda_state_mib', '64', ...args];
    const exe = path.join(build, 'bin/kimi-server');
    const proc = launcher.length
      ? spawn(launcher[0], [...launcher.slice(1), exe, ...argv],
              { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
      : spawn(exe, argv, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    const server = { proc, log: '', port: 0, metricsPort: 0, exited: null, ranks: {} };
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`server did not become ready in 60 s:\n${server.log}`));
    }, 60000);
    const onData = (chunk) => {
      server.log += chunk.toString();
      for (const m of server.log.matchAll(/rank (\d+): stage .*\(pid (\d+)\)/g)) {
        server.ranks[Number(m[1])] = Number(m[2]);
      }
      const m = server.log.match(/gRPC listening on 127\.0\.0\.1:(\d+).*metrics on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !server.port) {
        server.port = Number(m[1]);
        server.metricsPort = Number(m[2]);
        if (!waitServing) { clearTimeout(timer); resolve(server); }
      }
      if (waitServing && server.log.includes('SERVING ') && server.port) {
        clearTimeout(timer);
        resolve(server);
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code, signal) => {
      server.exited = { code, signal };
      clearTimeout(timer);
      if (!server.port) reject(new Error(`server exited (${code}, ${signal}):\n${server.log}`));
    });
    server.address = () => `127.0.0.1:${server.port}`;
    // Graceful stop: SIGTERM to the serving process (under mpirun, rank 0, which drains and then
    // releases the other ranks; mpirun itself treats a signal as a failed job).
    server.stop = () => new Promise((res) => {
      if (server.exited) return res(server.exited);
      proc.once('exit', (code, signal) => res({ code, signal }));
      if (launcher.length && server.ranks[0]) {
        process.kill(server.ranks[0], 'SIGTERM');
      } else {
        proc.kill('SIGTERM');
      }
    });
    process.on('exit', () => { if (!server.exited) proc.kill('SIGKILL'); });
  });
}

// The same, as an SPMD job: `mpirun -np N kimi-server ...` (rank 0 serves). `server.ranks` maps
// rank -> pid from the ranks' start-up lines.
function startMpiServer(np, args = [], options = {}) {
  const env = { OMPI_ALLOW_RUN_AS_ROOT: '1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: '1',
                OMPI_MCA_rmaps_base_oversubscribe: '1', ...(options.env || {}) };
  return startServer(args, { ...options, env,
                             launcher: ['mpirun', '--oversubscribe', '-np', String(np)] });
}

function client(server, creds = grpc.credentials.createInsecure(), options = {}) {
  return new kimi.Generation(server.address(), creds, options);
}
function healthClient(server, creds = grpc.credentials.createInsecure()) {
  return new health.Health(server.address(), creds);
}
function reflectionClient(server) {
  return new reflection.ServerReflection(server.address(), grpc.credentials.createInsecure());
}

// Runs one Generate stream to its end: { messages, text, tokens, final, status, error }.
function generate(c, request, metadata = new grpc.Metadata(), options = {}) {
  return new Promise((resolve) => {
    const out = { messages: [], text: '', tokens: [], final: null, status: null, error: null };
    const call = c.Generate(request, metadata, options);
    call.on('data', (m) => {
      out.messages.push(m);
      out.text += m.text;
      out.tokens.push(...m.token_ids);
      if (m.finish_reason !== 'FINISH_REASON_UNSPECIFIED') out.final = m;
    });
    call.on('error', (e) => { out.error = e; });
    call.on('status', (s) => { out.status = s; resolve(out); });
    out.call = call;
  });
}

function unary(c, method, request, metadata = new grpc.Metadata()) {
  return new Promise((resolve) => c[method](request, metadata, (err, res) => resolve({ err, res })));
}

function scrape(server) {
  return new Promise((resolve, reject) => {
    http.get(`http://127.0.0.1:${server.metricsPort}/metrics`, { agent: false }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
}
// Value of one series in a scrape, e.g. metric(text, 'kimi_requests_total{finish_reason="stop"}').
function metric(text, series) {
  for (const line of text.split('\n')) {
    if (line.startsWith(series + ' ')) return Number(line.slice(series.length + 1));
  }
  return NaN;
}

async function waitFor(pred, ms = 10000, what = 'condition') {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await pred()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

// Runs named async tests in order, each within `limit` ms; exit code 1 if any fails.
async function run(tests, limit = 120000) {
  let failed = 0;
  for (const [name, fn] of tests) {
    const t0 = Date.now();
    try {
      await Promise.race([fn(), new Promise((_, rej) => setTimeout(
        () => rej(new Error(`timed out after ${limit} ms`)), limit))]);
      console.log(`ok   ${name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e.stack || e}`);
    }
  }
  console.log(failed ? `${failed} of ${tests.length} failed` : `all ${tests.length} passed`);
  process.exit(failed ? 1 : 0);
}

// A fresh directory under the system's temp dir, removed with everything in it when the test
// process exits (pass or fail).
const tmpdirs = [];
process.on('exit', () => {
  for (const dir of tmpdirs) fs.rmSync(dir, {recursive: true, force: true});
});
function tmpdir(prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  tmpdirs.push(dir);
  return dir;
}

// A CA, a server and a client certificate it signed (for 127.0.0.1 and localhost), and a rogue
// certificate from another CA, made by openssl in `dir`: the PEM contents, and the files there
// (ca.pem, server.pem / server.key, client.pem / client.key, rogue.pem / rogue.key).
function makeCerts(dir) {
  const ssl = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  const san = path.join(dir, 'san.cnf');
  fs.writeFileSync(san, 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  ssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.pem',
      '-days', '2', '-subj', '/CN=kimi-test-ca');
  for (const who of ['server', 'client']) {
    ssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${who}.key`, '-out', `${who}.csr`,
        '-subj', `/CN=kimi-test-${who}`);
    ssl('x509', '-req', '-in', `${who}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key',
        '-CAcreateserial', '-out', `${who}.pem`, '-days', '2', '-extfile', san);
  }
  // A second CA, not trusted by the server, for a rogue client certificate.
  ssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'rogue.key', '-out', 'rogue.pem',
      '-days', '2', '-subj', '/CN=rogue');
  const read = (f) => fs.readFileSync(path.join(dir, f));
  return { dir, ca: read('ca.pem'), cert: read('client.pem'), key: read('client.key'),
           rogueCert: read('rogue.pem'), rogueKey: read('rogue.key') };
}

module.exports = { grpc, kimi, root, build, modelDir, startServer, startMpiServer, client,
                   healthClient,
                   reflectionClient, generate, unary, scrape, metric, waitFor, run, tmpdir,
                   execFileSync, makeCerts };
