// Converts an encoder of the npm `tiktoken` package into tiktoken format ("<base64> <rank>" per
// line, the format of Kimi's tiktoken.model). The package stores ranks as lines of
// "! <first rank> <base64> <base64> ...", ranks consecutive from the first.
//   node tiktoken_ranks.js ENCODING OUT_FILE     (e.g. cl100k_base models/cl100k_base.tiktoken)
// or require() it: { loadEncoder(name) -> {pat_str, special_tokens, bpe_ranks}, toTiktoken(str) }.
'use strict';
const fs = require('fs');
const path = require('path');

const root = process.env.KIMI_SOURCE_DIR || path.resolve(__dirname, '..', '..');

function loadEncoder(name) {
  const file = path.join(root, 'node_modules', 'tiktoken', 'encoders', name + '.json');
  if (!fs.existsSync(file)) {
    throw new Error(`${file} is missing: run ./scripts/fetch_vocab.sh (or ./scripts/test.sh), ` +
                    'which installs the npm package tiktoken');
  }
  return JSON.parse(fs.readFileSync(file, 'utf8'));
}

function toTiktoken(bpeRanks) {
  const out = [];
  for (const line of bpeRanks.split('\n')) {
    if (!line) continue;
    const parts = line.split(' ');
    if (parts[0] !== '!' || !/^\d+$/.test(parts[1])) throw new Error('unexpected bpe_ranks line');
    let rank = parseInt(parts[1], 10);
    for (const token of parts.slice(2)) {
      if (token) out.push(token + ' ' + rank++);
    }
  }
  return out.join('\n') + '\n';
}

module.exports = { loadEncoder, toTiktoken, root };

if (require.main === module) {
  const [name, outFile] = process.argv.slice(2);
  if (!name || !outFile) {
    console.error('usage: node tiktoken_ranks.js ENCODING OUT_FILE');
    process.exit(2);
  }
  try {
    const text = toTiktoken(loadEncoder(name).bpe_ranks);
    fs.mkdirSync(path.dirname(outFile), { recursive: true });
    fs.writeFileSync(outFile + '.tmp', text);
    fs.renameSync(outFile + '.tmp', outFile);
  } catch (e) {
    console.error(String(e.message || e));
    process.exit(1);
  }
}
