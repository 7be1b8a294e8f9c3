// Sharded serving through the real gRPC path: for each parallel layout, `mpirun -np N kimi-server`
// gives the same greedy tokens as one process, and logprobs within fp32 tolerance.
//
//   node parallel.test.js MODEL_DIR "tp=2" "ep=2" "pp=2" "tp=2,ep=2,pp=2" ...
//
// Tolerance: a sharded step sums the same products in a different order (per-rank partial sums of
// o_proj, MLP and expert outputs, added by an all-reduce): fp32 rounding differences of ~1e-6
// relative per layer. 2e-3 on logprobs is the engine's own fp32 bound against a float64 reference
// (DESIGN.md), so a sharding bug (a missing or doubled partial sum) shows as an O(0.1..1) error.
'use strict';
const assert = require('assert');
const h = require('../e2e/harness');

const TOLERANCE = 2e-3;
const model = process.argv[2];
const layouts = process.argv.slice(3);
const prompts = ['The quick brown fox jumps', 'Sharding a hybrid model over ranks',
                 'a'.repeat(90) + ' long enough to cross a KDA chunk'];

// "tp=2,ep=2,pp=2"; "rt=X" sets parallel.replicate_threshold (expert replication forced on).
function parse(layout) {
  const p = { tp: 1, ep: 1, pp: 1, rt: null };
  for (const kv of layout.split(',')) {
    const [k, v] = kv.split('=');
    p[k] = Number(v);
  }
  return p;
}

// One by one, then all at once (several sequences per step: pipeline micro-batches).
async function run(server) {
  const c = h.client(server);
  const req = (text) => ({ text, max_tokens: 8, ignore_eos: true, logprobs: 3,
                           sampling: { temperature: 0 } });
  const shape = (r) => {
    assert.strictEqual(r.status.code, 0, `${r.status.details}\n${server.log}`);
    return { tokens: r.tokens, logprobs: r.messages.flatMap((m) => m.logprobs) };
  };
  const out = [];
  for (const text of prompts) out.push(shape(await h.generate(c, req(text))));
  const together = await Promise.all(prompts.map((t) => h.generate(c, req(t))));
  return out.concat(together.map(shape));
}

(async () => {
  const env = { KIMI_MODEL: model };
  const common = ['--model', model, '--memory.kv_cache_mib', '64', '--memory.kda_state_mib', '64'];
  const single = await h.startServer(common, { env });
  const want = await run(single);
  await single.stop();
  const pages = (log) => Number((log.match(/(\d+) KV pages of/) || [])[1]);
  const singlePages = pages(single.log);
  await h.run(layouts.map((layout) => [`${layout} equals one process`, async () => {
    const p = parse(layout);
    const np = p.pp * Math.max(p.tp, p.ep);
    const extra = p.rt === null ? [] : ['--parallel.replicate_threshold', String(p.rt),
                                        '--parallel.max_replicated_experts', '8'];
    const server = await h.startMpiServer(np, [...common, '--tp', String(p.tp), '--ep',
                                               String(p.ep), '--pp', String(p.pp), ...extra],
                                          { env });
    try {
      assert.strictEqual(Object.keys(server.ranks).length, np, server.log);
      // Pools are sized by the heaviest stage's share, the same on every rank: between one
      // process's pages and pp times them. (Sized by rank 0's own stage, which can hold no MLA
      // layer, it took a page for a byte: a billion pages.)
      const got_pages = pages(server.log);
      assert.ok(got_pages >= singlePages && got_pages <= singlePages * p.pp,
                `${got_pages} KV pages against ${singlePages} in one process\n${server.log}`);
      const got = await run(server);
      // Every rank copied its matrices out of the mapped files (packed, in huge pages); all have
      // logged their load once they have served a step.
      const copies = server.log.match(/load: copied \d+ MiB of this rank's matrices/g) || [];
      assert.strictEqual(copies.length, np, `ranks that copied their matrices\n${server.log}`);
      let worst = 0;
      for (let i = 0; i < got.length; i++) {
        assert.deepStrictEqual(got[i].tokens, want[i].tokens, `run ${i}`);
        got[i].logprobs.forEach((lp, j) => {
          const ref = want[i].logprobs[j];
          worst = Math.max(worst, Math.abs(lp.logprob - ref.logprob));
          lp.top.forEach((t, k) => {
            assert.strictEqual(t.token_id, ref.top[k].token_id);
            worst = Math.max(worst, Math.abs(t.logprob - ref.top[k].logprob));
          });
        });
      }
      console.log(`     ${layout}: max |logprob difference| ${worst.toExponential(2)}`);
      assert.ok(worst <= TOLERANCE, `logprobs differ by ${worst}`);
      if (p.rt !== null) {
        // Replication moved work between ranks; the tokens above did not change.
        const replicated = h.metric(await h.scrape(server), 'kimi_moe_replicated_experts_total');
        console.log(`     ${layout}: ${replicated} expert replicas`);
        assert.ok(replicated > 0, 'no expert was replicated');
      }
    } finally {
      const exit = await server.stop();
      assert.strictEqual(exit.code, 0, `mpirun exit ${JSON.stringify(exit)}\n${server.log}`);
    }
  }]), 600000);
})().catch((e) => { console.error(e); process.exit(1); });
