// A rank that dies or hangs ends the whole job quickly with a message naming it; nothing hangs.
'use strict';
const assert = require('assert');
const h = require('../e2e/harness');

const model = process.argv[2];
const common = ['--model', model, '--memory.kv_cache_mib', '64', '--memory.kda_state_mib', '64',
                '--tp', '2', '--ep', '2', '--parallel.collective_timeout_seconds', '5'];
const exited = (server, ms) => Promise.race([
  new Promise((res) => server.proc.once('exit', (code, signal) => res({ code, signal }))),
  new Promise((res) => setTimeout(() => res(null), ms))]);

(async () => {
  await h.run([
    ['a killed rank ends the job, naming the rank', async () => {
      const server = await h.startMpiServer(2, common, { env: { KIMI_MODEL: model } });
      const t0 = Date.now();
      process.kill(server.ranks[1], 'SIGKILL');
      const exit = server.exited || await exited(server, 30000);
      assert.ok(exit, `job still running 30 s after rank 1 died:\n${server.log}`);
      assert.notStrictEqual(exit.code, 0);
      assert.ok(/rank 1/.test(server.log), server.log);
      console.log(`     ended ${Date.now() - t0} ms after the kill`);
    }],
    ['a hung rank ends the job after the collective timeout, naming it', async () => {
      const server = await h.startMpiServer(2, common, { env: { KIMI_MODEL: model } });
      process.kill(server.ranks[1], 'SIGSTOP');
      const t0 = Date.now();
      const c = h.client(server);
      // A step needs rank 1: the collective times out (5 s) and rank 0 ends the job.
      const r = h.generate(c, { text: 'are you there', max_tokens: 4 });
      const exit = server.exited || await exited(server, 40000);
      try { process.kill(server.ranks[1], 'SIGKILL'); } catch (e) { /* gone with the job */ }
      assert.ok(exit, `job still running 40 s after rank 1 hung:\n${server.log}`);
      assert.ok(/did not complete in 5 s/.test(server.log), server.log);
      assert.ok(/ranks? 1/.test(server.log), server.log);
      const res = await r;
      assert.ok(res.error, 'the request cannot have succeeded');
      console.log(`     ended ${Date.now() - t0} ms after the hang`);
    }],
    ['a rank that hangs while the server is idle ends the job, naming it', async () => {
      const server = await h.startMpiServer(2, common, { env: { KIMI_MODEL: model } });
      process.kill(server.ranks[1], 'SIGSTOP');
      const t0 = Date.now();
      // No request: rank 0's next heartbeat (every 5/3 s) waits for rank 1's answer for 5 s.
      const exit = server.exited || await exited(server, 40000);
      try { process.kill(server.ranks[1], 'SIGKILL'); } catch (e) { /* gone with the job */ }
      assert.ok(exit, `job still running 40 s after rank 1 hung:\n${server.log}`);
      assert.ok(/idle heartbeat: .*barrier with ranks 1 did not complete in 5 s/.test(server.log),
                server.log);
      console.log(`     ended ${Date.now() - t0} ms after the hang`);
    }],
  ], 90000);
})().catch((e) => { console.error(e); process.exit(1); });
