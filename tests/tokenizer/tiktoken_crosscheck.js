// Cross-check against an outside implementation: the npm `tiktoken` package (OpenAI's Rust
// tiktoken compiled to WASM) and our C++ encoder (kimi-tokenizer-encode) encode the same random
// Unicode strings with the same ranks and pattern; ids must be identical and decode(encode(s))
// must give s back. Configurations:
//   cl100k_base, o200k_base            (their own patterns, and <|endoftext|>-style specials)
//   Kimi's pattern + cl100k ranks      (tiktoken/lite runs the pattern unchanged: Rust regex has
//                                       class intersection; ours runs the PCRE2 rewrite, in both
//                                       its complement-class form and its lookahead form)
// Usage: node tiktoken_crosscheck.js PATH/TO/kimi-tokenizer-encode [strings per config]
'use strict';
const assert = require('assert');
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const root = process.env.KIMI_SOURCE_DIR || path.resolve(__dirname, '..', '..');
const tiktokenDir = path.join(root, 'node_modules', 'tiktoken');
if (!fs.existsSync(path.join(tiktokenDir, 'package.json'))) {
  console.error(`FAIL: ${tiktokenDir} is missing. Run ./scripts/test.sh (or ./scripts/fetch_vocab.sh), ` +
                'which installs the npm package tiktoken from package-lock.json.');
  process.exit(1);
}
const lite = require('module').createRequire(path.join(root, 'package.json'))('tiktoken/lite');
const { loadEncoder, toTiktoken } = require(path.join(root, 'tokenizer', 'npm', 'tiktoken_ranks.js'));

const tool = process.argv[2];
const perConfig = parseInt(process.argv[3] || '2500', 10);
assert(tool && fs.existsSync(tool), 'usage: node tiktoken_crosscheck.js ENCODE_TOOL [N]');

// ---- deterministic random Unicode text ----
let seed = 0x9e3779b9;
function rand() {  // xorshift32
  seed ^= seed << 13; seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}
const randInt = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const pick = (xs) => xs[randInt(0, xs.length - 1)];
const cp = (c) => String.fromCodePoint(c);

// PCRE2 10.42's property tables are Unicode 14.0; npm tiktoken's Rust regex has newer tables
// (Unicode 16), so a code point assigned after 14.0 (e.g. Egyptian Hieroglyphs Extended-A, CJK
// Extension H) is Cn to us and a letter to it, and pieces differ: a Unicode data version gap, not
// a pattern difference. Random code points are therefore drawn only from those PCRE2 says are
// assigned; named pools below may hold Cn code points that are unassigned in every version
// (U+FFFE, U+FFFF).
const unassignedOut = execFileSync(tool, ['--print-unassigned']).toString().trim().split('\n');
const pcre2Unicode = unassignedOut.shift();
const unassigned = unassignedOut.map((l) => l.split(' ').map((h) => parseInt(h, 16)));
function isUnassigned(c) {
  let lo = 0, hi = unassigned.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (c < unassigned[mid][0]) hi = mid - 1;
    else if (c > unassigned[mid][1]) lo = mid + 1;
    else return true;
  }
  return false;
}
function randomAssigned(lo, hi) {
  for (let tries = 0; tries < 64; ++tries) {
    const c = randInt(lo, hi);
    if (!isUnassigned(c)) return cp(c);
  }
  return 'x';
}
const range = (lo, hi) => () => randomAssigned(lo, hi);

const WORDS = ['the', 'The', 'THE', 'hello', 'World', 'tokenizer', 'Kimi', 'don', 'we', 'they',
  'naïve', 'café', 'Straße', 'ÉCOLE', 'ǅemal', 'ʰat', 'ΑΘΗΝΑ', 'αθηνα', 'Москва', 'привет', 'שלום',
  'مرحبا', 'नमस्ते', 'สวัสดี', 'ﬁne', 'İstanbul', 'ǈ', 'ᾈ', 'x', 'I', 'a'];
const CONTRACTIONS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'m", "'M", "'ll", "'LL", "'d",
  "'D", "'ſ", "'K", "'x", "'"];
const SPACES = [' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', '\r', ' \n', '\n ', '\u00a0', '\u3000',
  '\u2028', '\u2029', '\u180e', '\u200b', '\u0085', '\u000b', '\u000c', '\u1680', '\u2003', '\u202f',
  '\u205f', '\u001c', '\ufeff', '        ', '\t\t\n  '];
const PUNCT = ['.', ',', '!', '?', ';', ':', '-', '--', '...', '"', '(', ')', '[', ']', '{', '}',
  '<', '>', '/', '\\', '@', '#', '$', '%', '^', '&', '*', '+', '=', '_', '`', '~', '|', '\'',
  '«', '»', '—', '–', '…', '¿', '¡', '€', '©', '。', '、', '，', '！', '？', '「', '」', '『',
  '』', '・', '〜', '：', '；', '（', '）', '《', '》'];
const HAN_EXTRAS = ['々', '〇', 'ー', '〆', '㐀', '𠀀', '𪜀', '⺀', '⼀', '㊀', '㍻', '豈', '〡', 'ヶ'];
const NUMBERS = ['0', '7', '42', '123', '1234', '12345678', '3.14', '1,000', '٣٤٥', '۱۲', '०१२',
  '²', '³', '½', 'Ⅻ', 'ⅷ', '①', '１２３', '𝟘𝟙', '𑁦'];
const EMOJI = ['😀', '👍🏽', '👩‍💻', '👨‍👩‍👧‍👦', '🇯🇵', '🏳️‍🌈', '❤️', '✨', '🚀', '🫠', '🧑🏿‍🚀', '☃', '♀️'];
const MARKS = ['\u0301', '\u0300', '\u0308', '\u0327', '\u20dd', '\u0489', '\u093f', '\u0e31',
  '\u302a', '\u3099', '\ufe0f', '\u200d', '\u034f'];
const SPECIAL_LIKE = ['<|endoftext|>', '<|fim_prefix|>', '<|endofprompt|>', '<|im_end|>', '[BOS]',
  '<|endoftext', '|>', '<|'];
const GENERATORS = [
  [12, () => pick(WORDS)],
  [4, () => pick(CONTRACTIONS)],
  [8, () => pick(SPACES)],
  [6, () => pick(PUNCT)],
  [8, range(0x4e00, 0x9fff)],            // CJK unified ideographs
  [2, () => pick(HAN_EXTRAS)],
  [2, range(0x3040, 0x30ff)],            // kana
  [2, range(0xac00, 0xd7a3)],            // Hangul syllables
  [4, () => pick(NUMBERS)],
  [4, () => pick(EMOJI)],
  [2, range(0x1f300, 0x1faff)],          // emoji blocks, assigned or not
  [4, () => pick(MARKS)],
  [2, range(0x0300, 0x036f)],            // combining marks alone or after anything
  [3, range(0x20, 0x7e)],                // printable ASCII
  [2, range(0x00, 0x1f)],                // control characters
  [3, range(0xa0, 0x24f)],               // Latin-1, Latin Extended
  [2, range(0x370, 0x52f)],              // Greek, Cyrillic
  [2, range(0x590, 0x6ff)],              // Hebrew, Arabic
  [2, range(0x900, 0xdff)],              // Indic scripts (letters + marks)
  [3, range(0x80, 0xd7ff)],              // any BMP code point below the surrogates
  [2, range(0xe000, 0xfffd)],            // private use, compatibility, specials
  [2, () => pick(['\ufffd', '\ufffe', '\uffff', '\u0000', '\udc80', '\ud800', '\ue000'])],
  [2, range(0x10000, 0x3ffff)],          // supplementary planes 1-3
  [1, range(0xe0000, 0x10ffff)],         // tags, variation selectors, private use planes
  [1, () => pick(SPECIAL_LIKE)],
];
const totalWeight = GENERATORS.reduce((s, [w]) => s + w, 0);
function randomPart() {
  let r = rand() * totalWeight;
  for (const [w, g] of GENERATORS) {
    if ((r -= w) < 0) return g();
  }
  return 'x';
}
function randomString() {
  const n = rand() < 0.1 ? randInt(50, 400) : randInt(0, 40);
  let s = '';
  for (let i = 0; i < n; ++i) s += randomPart();
  return s;
}

// ---- run one configuration ----
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kimi-tok-'));
const rankFiles = {};
function rankFile(name) {
  if (!rankFiles[name]) {
    rankFiles[name] = path.join(tmp, name + '.tiktoken');
    fs.writeFileSync(rankFiles[name], toTiktoken(loadEncoder(name).bpe_ranks));
  }
  return rankFiles[name];
}

let checked = 0;
function check(label, encName, pattern, specials, cases, extraArgs) {
  const model = loadEncoder(encName);
  const ref = new lite.Tiktoken(model.bpe_ranks, specials, pattern);
  const patternFile = path.join(tmp, 'pattern.txt');
  const specialsFile = path.join(tmp, 'specials.json');
  fs.writeFileSync(patternFile, pattern);
  fs.writeFileSync(specialsFile, JSON.stringify(specials));
  // Text goes over as UTF-8 bytes: lone surrogates become U+FFFD exactly as wasm-bindgen's
  // string conversion does on the tiktoken side.
  const input = cases.map(([mode, s]) => mode + ' ' + Buffer.from(s, 'utf8').toString('base64'))
      .join('\n') + '\n';
  const out = execFileSync(tool, ['--ranks', rankFile(encName), '--pattern-file', patternFile,
                                  '--specials', specialsFile, ...extraArgs],
                           { input, maxBuffer: 1 << 28 }).toString().split('\n');
  let failures = 0;
  cases.forEach(([mode, s], i) => {
    const want = Array.from(mode === 's' ? ref.encode(s, 'all') : ref.encode_ordinary(s)).join(' ');
    const [got, roundTrip] = out[i].split('\t');
    if (got !== want || roundTrip !== '1') {
      if (++failures <= 5) {
        console.error(`${label}: mismatch on ${JSON.stringify(s)} (mode ${mode})\n` +
                      `  tiktoken: ${want}\n  ours:     ${got}  (decode round trip: ${roundTrip})`);
      }
    }
  });
  ref.free();
  console.log(`${label}: ${cases.length - failures}/${cases.length} strings identical`);
  checked += cases.length;
  return failures;
}

function cases(n, withSpecials) {
  const out = [];
  for (let i = 0; i < n; ++i) {
    let s = randomString();
    if (withSpecials && i % 5 === 0) s += pick(SPECIAL_LIKE) + randomString();
    out.push([withSpecials && i % 2 === 0 ? 's' : 'o', s]);
  }
  return out;
}

const kimiPattern = execFileSync(tool, ['--print-kimi-pattern']).toString();
console.log(`PCRE2 Unicode tables: ${pcre2Unicode}; ${unassigned.length} unassigned ranges excluded from random draws`);
let failures = 0;
try {
  for (const enc of ['cl100k_base', 'o200k_base']) {
    const model = loadEncoder(enc);
    failures += check(enc, enc, model.pat_str, model.special_tokens, cases(perConfig, true), []);
  }
  const kimiCases = cases(perConfig, false);
  failures += check('kimi pattern (complement form) + cl100k ranks', 'cl100k_base', kimiPattern,
                    {}, kimiCases, []);
  failures += check('kimi pattern (lookahead form) + cl100k ranks', 'cl100k_base', kimiPattern,
                    {}, kimiCases, ['--lookahead-form']);
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
if (failures) {
  console.log(`${checked - failures} passed, ${failures} failed`);
  process.exit(1);
}
console.log(`all ${checked} strings identical to npm tiktoken`);
