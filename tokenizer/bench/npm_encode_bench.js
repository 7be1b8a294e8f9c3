// Encode throughput of the npm `tiktoken` package (Rust tiktoken compiled to WASM) on a text file.
// Usage: node npm_encode_bench.js TEXT_FILE ENCODING PATTERN_OR_DASH REPEATS
// ENCODING is an npm encoder name (cl100k_base); PATTERN "-" keeps the encoder's own pattern, any
// other value builds tiktoken/lite's Tiktoken(bpe_ranks, special_tokens, pattern).
// Prints one line: "<MB/s> <token count>".
'use strict';
const fs = require('fs');
const path = require('path');
const root = process.env.KIMI_SOURCE_DIR || path.resolve(__dirname, '..', '..');
let lite, encoders;
try {
  lite = require('module').createRequire(path.join(root, 'package.json'))('tiktoken/lite');
  encoders = path.join(root, 'node_modules', 'tiktoken', 'encoders');
} catch (e) {
  console.error('npm package tiktoken is missing: run ./scripts/fetch_vocab.sh (or ./scripts/test.sh)');
  process.exit(2);
}
const [file, encoding, pattern, repeatsArg] = process.argv.slice(2);
const text = fs.readFileSync(file, 'utf8');
const bytes = Buffer.byteLength(text, 'utf8');
const model = require(path.join(encoders, encoding + '.json'));
const enc = new lite.Tiktoken(model.bpe_ranks, model.special_tokens,
                              pattern === '-' ? model.pat_str : pattern);
const repeats = Math.max(1, parseInt(repeatsArg || '3', 10));
let n = enc.encode_ordinary(text).length;  // warm-up
let best = Infinity;
for (let r = 0; r < repeats; ++r) {
  const t0 = process.hrtime.bigint();
  n = enc.encode_ordinary(text).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  best = Math.min(best, s);
}
enc.free();
console.log((bytes / 1e6 / best).toFixed(3) + ' ' + n);
