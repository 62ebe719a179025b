// A second, independent implementation of the open1b wire format, written from docs/protocol.md:
// canonical CBOR (strict decode, canonical encode), message signing and verification (Ed25519
// through node:crypto), peer IDs, and the DHT claim-record order. It is checked against
// tests/vectors by check_vectors.mjs and used by the js-libp2p peer in peer.mjs.
import { createPrivateKey, createPublicKey, sign as edSign, verify as edVerify } from 'node:crypto'
import { blake2b } from '@noble/hashes/blake2.js'

export class ProtocolError extends Error {
  constructor (code, message) { super(`${code}: ${message}`); this.code = code }
}

// -- canonical CBOR -----------------------------------------------------------------------
// Values: integers are BigInt, floats are Number, byte strings Uint8Array, text strings, arrays,
// maps are Map (insertion order = canonical order), booleans, null.
const MAX_DEPTH = 8
const SIMPLE_OK = new Set([20, 21, 22, 25, 26, 27])

function scan (data) { // §3.2 step 2: heads in byte order, the first defect decides
  let pos = 0
  const pending = [1] // items left in each open container
  const inMap = [false]
  while (pending.length > 0) {
    if (pending[pending.length - 1] === 0) { pending.pop(); inMap.pop(); continue }
    const isKey = inMap[inMap.length - 1] && pending[pending.length - 1] % 2 === 0
    pending[pending.length - 1]--
    if (pos >= data.length) throw new ProtocolError('malformed', 'truncated CBOR')
    const major = data[pos] >> 5; const info = data[pos] & 31
    pos++
    if (info === 31) throw new ProtocolError('non_canonical', 'indefinite-length item')
    if (info > 27) throw new ProtocolError('malformed', 'reserved additional information')
    let arg = BigInt(info)
    if (info >= 24) {
      const width = 1 << (info - 24)
      if (pos + width > data.length) throw new ProtocolError('malformed', 'truncated CBOR')
      arg = 0n
      for (let i = 0; i < width; i++) arg = (arg << 8n) | BigInt(data[pos + i])
      pos += width
    }
    if (isKey && major !== 3) throw new ProtocolError('malformed', 'map keys must be text')
    if (major === 6) throw new ProtocolError('malformed', 'CBOR tags are not allowed')
    if (major === 7 && !SIMPLE_OK.has(info)) throw new ProtocolError('malformed', `simple value ${arg}`)
    if (major === 2 || major === 3) {
      if (BigInt(pos) + arg > BigInt(data.length)) throw new ProtocolError('malformed', 'truncated CBOR')
      pos += Number(arg)
    } else if (major === 4 || major === 5) {
      if (pending.length > MAX_DEPTH) throw new ProtocolError('malformed', `nesting deeper than ${MAX_DEPTH}`)
      if (arg > BigInt(data.length)) throw new ProtocolError('malformed', 'truncated CBOR')
      pending.push(Number(major === 4 ? arg : 2n * arg))
      inMap.push(major === 5)
    }
  }
  if (pos !== data.length) throw new ProtocolError('malformed', 'bytes after the data item')
}

function halfToNumber (h) {
  const exp = (h >> 10) & 31; const mant = h & 1023
  const v = exp === 0 ? mant * 2 ** -24 : exp === 31 ? (mant ? NaN : Infinity) : (1024 + mant) * 2 ** (exp - 25)
  return h & 0x8000 ? -v : v
}

function parse (data) { // data was scanned: well-formed, so no bounds checks here
  let pos = 0
  const text = new TextDecoder('utf-8', { fatal: true })
  const item = () => {
    const major = data[pos] >> 5; const info = data[pos] & 31
    pos++
    let arg = BigInt(info)
    if (info >= 24) {
      const width = 1 << (info - 24)
      arg = 0n
      for (let i = 0; i < width; i++) arg = (arg << 8n) | BigInt(data[pos + i])
      pos += width
      if (major === 7) {
        const view = new DataView(data.buffer, data.byteOffset + pos - width, width)
        return width === 2 ? halfToNumber(view.getUint16(0)) : width === 4 ? view.getFloat32(0) : view.getFloat64(0)
      }
    }
    switch (major) {
      case 0: return arg
      case 1: return -1n - arg
      case 2: pos += Number(arg); return data.slice(pos - Number(arg), pos)
      case 3: pos += Number(arg)
        try { return text.decode(data.subarray(pos - Number(arg), pos)) } catch { throw new ProtocolError('malformed', 'text is not UTF-8') }
      case 4: return Array.from({ length: Number(arg) }, item)
      case 5: { const m = new Map(); const n = Number(arg)
        for (let i = 0; i < n; i++) { const k = item(); m.set(typeof k === 'object' && k !== null ? keyOf(k) : k, item()) }
        m.pairs = n; return m }
      default: return info === 20 ? false : info === 21 ? true : null
    }
  }
  return item()
}

const keyOf = (k) => k instanceof Uint8Array ? `bytes:${hex(k)}` : JSON.stringify(k) // scan refuses non-text keys

function head (major, n) {
  n = BigInt(n)
  const m = major << 5
  if (n < 24n) return [m | Number(n)]
  for (const [info, width] of [[24, 1], [25, 2], [26, 4], [27, 8]]) {
    if (n < 1n << BigInt(8 * width)) {
      const out = [m | info]
      for (let i = width - 1; i >= 0; i--) out.push(Number((n >> BigInt(8 * i)) & 0xffn))
      return out
    }
  }
  throw new ProtocolError('malformed', 'integer too large for CBOR')
}

function floatBytes (v) { // the shortest of binary16/32/64 that holds v exactly
  if (Number.isNaN(v)) return [0xf9, 0x7e, 0x00]
  const f32 = new DataView(new ArrayBuffer(4)); f32.setFloat32(0, v)
  if (Object.is(f32.getFloat32(0), v)) {
    const bits = f32.getUint32(0); const sign = (bits >>> 16) & 0x8000
    const exp = (bits >>> 23) & 255; const mant = bits & 0x7fffff
    let h = null
    if (exp === 255) h = sign | 0x7c00
    else if (exp === 0 && mant === 0) h = sign
    else {
      const e = exp - 127 + 15
      if (e >= 1 && e < 31 && (mant & 0x1fff) === 0) h = sign | (e << 10) | (mant >> 13)
      else if (e < 1 && Number.isInteger(Math.abs(v) * 2 ** 24) && Math.abs(v) * 2 ** 24 < 1024) h = sign | (Math.abs(v) * 2 ** 24)
    }
    if (h !== null && Object.is(halfToNumber(h), v)) return [0xf9, h >> 8, h & 255]
    return [0xfa, ...new Uint8Array(f32.buffer)]
  }
  const f64 = new DataView(new ArrayBuffer(8)); f64.setFloat64(0, v)
  return [0xfb, ...new Uint8Array(f64.buffer)]
}

const compareBytes = (a, b) => { // length first, then bytewise (= bytewise order of encodings)
  if (a.length !== b.length) return a.length - b.length
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] - b[i]
  return 0
}

export function encode (value) {
  const out = []
  const put = (v) => {
    if (typeof v === 'bigint') out.push(...(v >= 0n ? head(0, v) : head(1, -1n - v)))
    else if (typeof v === 'number') out.push(...floatBytes(v))
    else if (typeof v === 'string') { const b = new TextEncoder().encode(v); out.push(...head(3, b.length), ...b) }
    else if (v instanceof Uint8Array) out.push(...head(2, v.length), ...v)
    else if (Array.isArray(v)) { out.push(...head(4, v.length)); v.forEach(put) }
    else if (v instanceof Map) {
      const entries = [...v.entries()].map(([k, x]) => [encode(k), x]).sort((a, b) => compareBytes(a[0], b[0]))
      for (let i = 1; i < entries.length; i++) {
        if (compareBytes(entries[i - 1][0], entries[i][0]) === 0) throw new ProtocolError('non_canonical', 'duplicate key')
      }
      out.push(...head(5, entries.length))
      for (const [k, x] of entries) { out.push(...k); put(x) }
    } else if (v === true || v === false || v === null) out.push(v === null ? 0xf6 : v ? 0xf5 : 0xf4)
    else throw new ProtocolError('malformed', `cannot encode ${typeof v}`)
  }
  put(value)
  return Uint8Array.from(out)
}

export function decode (data, maxSize) {
  if (data.length > maxSize) throw new ProtocolError('oversize', `${data.length} bytes exceeds ${maxSize}`)
  scan(data)
  const value = parse(data)
  const again = encode(value)
  if (compareBytes(again, data) !== 0 || hasDuplicateKeys(value)) throw new ProtocolError('non_canonical', 'not canonical CBOR')
  return value
}

const hasDuplicateKeys = (v) => v instanceof Map ? (v.size !== v.pairs || [...v.values()].some(hasDuplicateKeys))
  : Array.isArray(v) ? v.some(hasDuplicateKeys) : false

// -- keys, hashes, peer IDs ---------------------------------------------------------------
export const hex = (b) => Buffer.from(b).toString('hex')
export const unhex = (s) => Uint8Array.from(Buffer.from(s.replace(/^0x/, ''), 'hex'))
export const blake2b256 = (...parts) => blake2b(Buffer.concat(parts.map((p) => Buffer.from(p))), { dkLen: 32 })

const B58 = '123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz'
const PEER_ID_PREFIX = Uint8Array.from([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])
export function peerIdFromPublicKey (key) {
  const bytes = Buffer.concat([PEER_ID_PREFIX, key])
  let n = BigInt('0x' + bytes.toString('hex')); let out = ''
  while (n > 0n) { out = B58[Number(n % 58n)] + out; n /= 58n }
  return '1'.repeat(bytes.findIndex((b) => b !== 0)) + out // each leading zero byte is a '1'
}

const PKCS8_ED25519 = Buffer.from('302e020100300506032b657004220420', 'hex')
const SPKI_ED25519 = Buffer.from('302a300506032b6570032100', 'hex')
export const publicKeyOf = (seed) => Uint8Array.from(createPublicKey(privateKeyOf(seed)).export({ format: 'der', type: 'spki' }).subarray(12))
const privateKeyOf = (seed) => createPrivateKey({ key: Buffer.concat([PKCS8_ED25519, seed]), format: 'der', type: 'pkcs8' })
const publicKeyObject = (key) => createPublicKey({ key: Buffer.concat([SPKI_ED25519, key]), format: 'der', type: 'spki' })

// -- messages -----------------------------------------------------------------------------
const RUN_FORMAT = 2n // docs/run-format.md: checked before the schema
const HASH = ['bytes', 32]; const KEY = ['bytes', 32]; const UINT = ['uint', 2n ** 64n - 1n]
const text = (n) => ['text', n]
const SCALARS = (n) => ['scalars', n]
export const SCHEMAS = {
  manifest: { signer: 'publisher', maxSize: 1 << 20, fields: { format: ['uint', 255n], engine: text(64), engine_version: text(64), model: SCALARS(64), data: SCALARS(16), seed: UINT, steps: ['uint', 8192n], state_hashes: ['hashes', 8193], checkpoints: ['hashes', 8193], witnesses: ['hashes', 8192], samples_root: HASH, samples: UINT, samples_blob: HASH, samples_size: UINT, publisher: KEY, created_at: UINT } },
  external_manifest: { signer: 'publisher', maxSize: 1 << 20, fields: { engine: text(64), engine_version: text(64), model: SCALARS(64), data: SCALARS(16), steps: ['uint', 1n << 20n], first_step: UINT, trajectory_format: ['enum', ['jsonl']], trajectory_uri: text(256), trajectory_size: ['uint', 64n << 20n], trajectory_digest: HASH, trajectory_root: HASH, publisher: KEY, created_at: UINT } },
  claim: { signer: 'claimant', maxSize: 512, fields: { run: HASH, step: UINT, slot: ['uint', 255n], claimant: KEY, issued_at: UINT, lease_expiry: UINT, expected_done: UINT, device: text(70) }, optional: ['expected_done', 'device'] },
  attestation: { signer: 'signer', maxSize: 1024, fields: { run: HASH, step: UINT, pre_state: HASH, post_state: HASH, verdict: ['enum', ['match', 'mismatch']], engine: text(64), engine_version: text(64), hardware: text(128), device: text(70), elapsed_ms: UINT, witness: HASH, signer: KEY, issued_at: UINT } },
  reveal: { signer: 'revealer', maxSize: 512, fields: { run: HASH, step: UINT, witness: HASH, revealer: KEY, issued_at: UINT } },
  eval: { signer: 'signer', maxSize: 512, fields: { run: HASH, state: UINT, loss: ['uint', 2n ** 32n - 1n], claimed: ['uint', 2n ** 32n - 1n], verdict: ['enum', ['result', 'match', 'mismatch']], engine: text(64), engine_version: text(64), device: text(70), signer: KEY, issued_at: UINT } },
  spotcheck: { signer: 'signer', maxSize: 1024, fields: { run: HASH, step: UINT, pre_state: HASH, fingerprint: HASH, challenge: ['bytes', 64], slot_challenge: ['bytes', 64], slot: UINT, chunks_total: UINT, chunks: ['uints', 4], verdict: ['enum', ['pass', 'fail']], caught: ['enum', ['none', 'loss', 'gradient', 'loss_sum', 'proof', 'sum', 'update', 'no_answer']], engine: text(64), engine_version: text(64), device: text(70), elapsed_ms: UINT, signer: KEY, issued_at: UINT } }
}

const utf8len = (s) => new TextEncoder().encode(s).length
function checkField (name, [type, limit], v) {
  const bad = () => { throw new ProtocolError('wrong_type', name) }
  if (type === 'uint') { if (typeof v !== 'bigint' || v < 0n || v > limit) bad() } else if (type === 'bytes') { if (!(v instanceof Uint8Array) || v.length !== limit) bad() } else if (type === 'text') { if (typeof v !== 'string' || utf8len(v) > limit) bad() } else if (type === 'enum') { if (!limit.includes(v)) bad() } else if (type === 'uints') { if (!Array.isArray(v) || v.length > limit || v.some((x) => typeof x !== 'bigint' || x < 0n || x > 2n ** 64n - 1n)) bad() } else if (type === 'hashes') { if (!Array.isArray(v) || v.length > limit || v.some((h) => !(h instanceof Uint8Array) || h.length !== 32)) bad() } else if (type === 'scalars') {
    if (!(v instanceof Map) || v.size > limit) bad()
    for (const [k, x] of v) {
      if (typeof k !== 'string' || utf8len(k) > 256) bad()
      if (!(typeof x === 'bigint' || (typeof x === 'number' && Number.isFinite(x)) || (typeof x === 'string' && utf8len(x) <= 256))) bad()
    }
  }
}

export const PROTOCOL_VERSION = 2n
export const signingBytes = (kind, body) => Buffer.concat([Buffer.from(`open1b/v${PROTOCOL_VERSION}/sig\0` + kind + '\0'), encode(body)])
const DEVICE_CLASS = /^(cpu|cuda)\/[a-z0-9_]{1,32}(-[a-z0-9_]{1,32})?$/ // §5.2 (JavaScript's $ is the end of input)

// §5.4: strict Ed25519. Node's crypto (OpenSSL) checks the equation and S < L but accepts
// small-order keys and R, so rules 1-4 are checked here first.
const P = 2n ** 255n - 19n
const L = 2n ** 252n + 27742317777372353535851937790883648493n
const Y8 = 2707385501144840649318225287225658788936804267575313519463743609750303402022n
const SMALL_ORDER_Y = new Set([0n, 1n, P - 1n, Y8, P - Y8, P, P + 1n])
const littleEndian = (b) => BigInt('0x' + (hex(Uint8Array.from(b).reverse()) || '0'))
const yOf = (point) => littleEndian(point) & ((1n << 255n) - 1n)
export function verifySignature (key, message, sig) {
  if (key.length !== 32 || sig.length !== 64) return false
  if (littleEndian(sig.subarray(32)) >= L) return false // rule 1
  if (yOf(key) >= P) return false // rule 2
  if (SMALL_ORDER_Y.has(yOf(key)) || SMALL_ORDER_Y.has(yOf(sig.subarray(0, 32)))) return false // rules 3, 4
  try { return edVerify(null, message, publicKeyObject(key), sig) } catch { return false } // rule 5
}

export function decodeMessage (data, kinds = Object.keys(SCHEMAS)) {
  const value = decode(data, Math.max(...kinds.map((k) => SCHEMAS[k]?.maxSize ?? 0))) // the largest limit first
  const kind = value instanceof Map ? value.get('kind') : undefined
  if (!kinds.includes(kind)) throw new ProtocolError('kind', `not an expected kind: ${kind}`)
  const schema = SCHEMAS[kind]
  if (data.length > schema.maxSize) throw new ProtocolError('oversize', `${kind} larger than ${schema.maxSize}`)
  if (value.get('v') !== PROTOCOL_VERSION) throw new ProtocolError('version', 'unsupported version')
  if (kind === 'manifest' && value.get('format') !== RUN_FORMAT) throw new ProtocolError('run_format', `run format ${value.get('format')} is not supported; this peer reads format ${RUN_FORMAT}`)
  const names = ['kind', 'v', 'sig', ...Object.keys(schema.fields)]
  for (const k of value.keys()) if (!names.includes(k)) throw new ProtocolError('unknown_field', k)
  const optional = schema.optional || [] // "? field" in the CDDL: may be absent, never null
  for (const k of names) if (!value.has(k) && !optional.includes(k)) throw new ProtocolError('missing_field', k)
  checkField('sig', ['bytes', 64], value.get('sig'))
  for (const [name, type] of Object.entries(schema.fields)) if (value.has(name)) checkField(name, type, value.get(name))
  if (kind === 'manifest' && (value.get('steps') < 1n || BigInt(value.get('state_hashes').length) !== value.get('steps') + 1n)) throw new ProtocolError('state_hashes', 'steps + 1 hashes')
  if (kind === 'manifest' && BigInt(value.get('checkpoints').length) !== value.get('steps') + 1n) throw new ProtocolError('checkpoints', 'steps + 1 addresses')
  if (kind === 'manifest' && BigInt(value.get('witnesses').length) !== value.get('steps')) throw new ProtocolError('witnesses', 'one commitment per step')
  if (kind === 'manifest' && value.get('samples') < 1n) throw new ProtocolError('samples', 'at least one sample')
  if (kind === 'manifest') {
    const data = value.get('data')
    const hashes = ['fingerprints_root', 'fingerprints_blob'].map((k) => data.get(k))
    if (hashes.some((h) => h !== undefined) && !hashes.every((h) => typeof h === 'string' && /^[0-9a-f]{64}$/.test(h))) throw new ProtocolError('fingerprints', 'fingerprints_root and fingerprints_blob: both or neither, 64 lowercase hex digits each')
  }
  if (kind === 'external_manifest' && value.get('steps') < 1n) throw new ProtocolError('state_hashes', 'steps >= 1')
  if (kind === 'claim' && value.get('lease_expiry') <= value.get('issued_at')) throw new ProtocolError('lease_order', 'lease_expiry after issued_at')
  if (kind === 'claim' && value.has('device') && !DEVICE_CLASS.test(value.get('device'))) throw new ProtocolError('device', 'not a device class') // optional (r21)
  if (kind === 'eval' && (value.get('verdict') === 'mismatch') === (value.get('loss') === value.get('claimed'))) throw new ProtocolError('eval_verdict', 'loss = claimed unless a mismatch')
  if (kind === 'spotcheck' && (value.get('verdict') === 'pass') !== (value.get('caught') === 'none')) throw new ProtocolError('spot_verdict', 'a pass catches nothing, a fail names the link')
  if ((kind === 'attestation' || kind === 'eval' || kind === 'spotcheck') && !DEVICE_CLASS.test(value.get('device'))) throw new ProtocolError('device', 'not a device class')
  const body = new Map([...value].filter(([k]) => k !== 'sig'))
  const signer = value.get(schema.signer)
  if (!verifySignature(signer, signingBytes(kind, body), value.get('sig'))) throw new ProtocolError('bad_signature', 'signature does not verify')
  return { kind, fields: value, body, signer, peerId: peerIdFromPublicKey(signer), digest: blake2b256(data), encoded: data }
}

export function signMessage (seed, kind, fields) { // fields: a Map without kind, v, sig and signer
  const body = new Map([['kind', kind], ['v', PROTOCOL_VERSION], ...fields, [SCHEMAS[kind].signer, publicKeyOf(seed)]])
  const sig = edSign(null, signingBytes(kind, body), privateKeyOf(seed))
  return encode(new Map([...body, ['sig', Uint8Array.from(sig)]]))
}

// -- claim records in the DHT -------------------------------------------------------------
export function claimKey (run, step, slot) { // /open1b/c/ + 16 bytes of B2(tag ‖ run ‖ u64le(step) ‖ u8(slot))
  const where = Buffer.alloc(9)
  where.writeBigUInt64LE(BigInt(step)); where.writeUInt8(Number(slot), 8)
  return `/open1b/c/${hex(blake2b256(Buffer.from('open1b/claim-key/v1\0'), run, where).subarray(0, 16))}`
}
export function validateClaimRecord (key, value) {
  const claim = decodeMessage(value, ['claim'])
  const f = claim.fields
  if (claimKey(f.get('run'), f.get('step'), f.get('slot')) !== key) throw new ProtocolError('claim_key', 'stored under another key')
  return claim
}
function precedence (a, b) { // negative when claim a is preferred to b
  const ia = a.fields.get('issued_at'); const ib = b.fields.get('issued_at')
  const ra = ia / 60n; const rb = ib / 60n
  if (ra !== rb) return ra > rb ? -1 : 1 // the newer lease round first
  if (ia !== ib) return ia < ib ? -1 : 1 // then the earliest issue
  return compareBytesLex(a.fields.get('claimant'), b.fields.get('claimant')) || compareBytesLex(a.encoded, b.encoded)
}
function compareBytesLex (a, b) {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i]
  return a.length - b.length
}
export function selectClaimRecord (key, values) { // index of the preferred valid record, or null
  let best = null
  values.forEach((value, index) => {
    let claim
    try { claim = validateClaimRecord(key, value) } catch { return }
    if (best === null || precedence(claim, best.claim) < 0) best = { index, claim }
  })
  return best === null ? null : best.index
}
