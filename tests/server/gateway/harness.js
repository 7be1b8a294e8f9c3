// Shared by the gateway's end-to-end tests: everything of ../e2e/harness.js (kimi-server on free
// ports, the test runner, /metrics scraping, gRPC clients) plus kimi-gateway in front of a server,
// the official `openai` npm client pointed at it, and plain HTTP for what the client hides.
'use strict';
const { spawn } = require('child_process');
const http = require('http');
const net = require('net');
const path = require('path');
const h = require('../e2e/harness');

let OpenAI;
try {
  OpenAI = require(path.join(h.root, 'node_modules/openai'));
} catch (e) {
  console.error('missing npm package openai: run ./scripts/test.sh (it installs the test clients)');
  process.exit(1);
}

// Starts kimi-gateway in front of `backend` (a server from startServer, or "127.0.0.1:PORT");
// resolves once it prints the HTTP port it listens on.
function startGateway(backend, args = []) {
  const target = typeof backend === 'string' ? backend : backend.address();
  return new Promise((resolve, reject) => {
    const proc = spawn(path.join(h.build, 'bin/kimi-gateway'),
                       ['--backend', target, '--listen', '127.0.0.1:0', ...args],
                       { stdio: ['ignore', 'pipe', 'pipe'] });
    const gw = { proc, log: '', port: 0, exited: null };
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`gateway did not start in 20 s:\n${gw.log}`));
    }, 20000);
    const onData = (chunk) => {
      gw.log += chunk.toString();
      const m = gw.log.match(/HTTP listening on 127\.0\.0\.1:(\d+)/);
      if (m && !gw.port) {
        gw.port = Number(m[1]);
        clearTimeout(timer);
        resolve(gw);
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code, signal) => {
      gw.exited = { code, signal };
      clearTimeout(timer);
      if (!gw.port) reject(new Error(`gateway exited (${code}, ${signal}):\n${gw.log}`));
    });
    gw.url = () => `http://127.0.0.1:${gw.port}`;
    gw.stop = () => new Promise((res) => {
      if (gw.exited) return res(gw.exited);
      proc.once('exit', (code, signal) => res({ code, signal }));
      proc.kill('SIGTERM');
    });
    process.on('exit', () => { if (!gw.exited) proc.kill('SIGKILL'); });
  });
}

// The official client against the gateway. No retries: every error must show as it is.
function openai(gw, { apiKey = 'sk-test', maxRetries = 0, timeout = 120000 } = {}) {
  return new OpenAI({ apiKey, baseURL: `${gw.url()}/v1`, maxRetries, timeout });
}

// One plain HTTP request: { status, headers, body (parsed JSON when it is JSON), text }.
function request(gw, method, urlPath, { body, headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined
      : (typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body));
    const req = http.request(`${gw.url()}${urlPath}`, {
      method, agent: false,
      headers: { 'content-type': 'application/json', ...headers },
    }, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        let parsed = null;
        try { parsed = JSON.parse(text); } catch (e) { /* not JSON */ }
        resolve({ status: res.statusCode, headers: res.headers, body: parsed, text });
      });
    });
    req.on('error', reject);
    if (data !== undefined) req.write(data);
    req.end();
  });
}

// A free 127.0.0.1 port (nothing listens on it when this resolves).
function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// Runs `fn`, which must reject with an OpenAI APIError; returns the error.
async function apiError(fn) {
  try {
    await fn();
  } catch (e) {
    if (!(e instanceof OpenAI.APIError)) throw e;
    return e;
  }
  throw new Error('expected an API error, the request succeeded');
}

// Drains a stream: { chunks, text (per choice index), finish (per index), usage (last chunk) }.
async function collect(stream) {
  const out = { chunks: [], text: {}, finish: {}, usage: null };
  for await (const chunk of stream) {
    out.chunks.push(chunk);
    if (chunk.usage) out.usage = chunk.usage;
    for (const c of chunk.choices) {
      const piece = c.delta ? (c.delta.content || '') : (c.text || '');
      out.text[c.index] = (out.text[c.index] || '') + piece;
      if (c.finish_reason) out.finish[c.index] = c.finish_reason;
    }
  }
  return out;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The served model's name, as the gateway lists it.
async function modelName(client) {
  return (await client.models.list()).data[0].id;
}

module.exports = { ...h, OpenAI, startGateway, openai, request, freePort, apiError, collect, sleep,
                   modelName };
