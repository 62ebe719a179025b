// Check open1b.mjs against the Python-generated vectors: node check_vectors.mjs <tests/vectors>
// Prints {"suite": {"passed": n, "failed": [case: why, ...]}} and exits 1 if anything failed.
import { readFileSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import {
  ProtocolError, decode, decodeMessage, encode, hex, peerIdFromPublicKey, publicKeyOf, selectClaimRecord,
  signMessage, signingBytes, unhex, validateClaimRecord, verifySignature
} from './open1b.mjs'

const root = process.argv[2]
const results = {}

function fromTyped (node) {
  const [[kind, inner]] = Object.entries(node)
  switch (kind) {
    case 'null': return null
    case 'bool': case 'text': return inner
    case 'uint': case 'nint': return BigInt(inner)
    case 'float': return new DataView(unhex(inner).buffer).getFloat64(0)
    case 'bytes': return unhex(inner)
    case 'array': return inner.map(fromTyped)
    case 'map': return new Map(inner.map(([k, v]) => [fromTyped(k), fromTyped(v)]))
  }
  throw new Error(`typed JSON kind ${kind}`)
}

function toTyped (v) {
  if (v === null) return { null: null }
  if (typeof v === 'boolean') return { bool: v }
  if (typeof v === 'bigint') return v >= 0n ? { uint: String(v) } : { nint: String(v) }
  if (typeof v === 'number') { const d = new DataView(new ArrayBuffer(8)); d.setFloat64(0, v); return { float: '0x' + hex(new Uint8Array(d.buffer)) } }
  if (typeof v === 'string') return { text: v }
  if (v instanceof Uint8Array) return { bytes: '0x' + hex(v) }
  if (Array.isArray(v)) return { array: v.map(toTyped) }
  return { map: [...v.entries()].map(([k, x]) => [toTyped(k), toTyped(x)]) }
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b)
const eqBytes = (a, b) => hex(a) === hex(b)
function expectCode (fn, code) {
  try { fn() } catch (err) {
    if (err instanceof ProtocolError && err.code === code) return
    throw new Error(`expected ${code}, got ${err.message}`)
  }
  throw new Error(`expected ${code}, got success`)
}

const DECODE_CODES = new Set(['oversize', 'malformed', 'non_canonical', 'kind', 'version', 'unknown_field',
  'missing_field', 'wrong_type', 'bad_signature', 'run_format', 'state_hashes', 'checkpoints', 'witnesses', 'samples',
  'fingerprints', 'lease_order', 'device', 'eval_verdict', 'spot_verdict'])
const TOPIC_KINDS = {
  attestation: ['attestation'], claim: ['claim'], reveal: ['reveal'], manifest: ['manifest', 'external_manifest'],
  sync: ['attestation', 'reveal', 'spotcheck'], eval: ['eval'], spotcheck: ['spotcheck']
}

const checks = {
  codec (c) {
    const data = unhex(c.encoded)
    if (c.error) return expectCode(() => decode(data, c.max_size), c.error)
    if (!eqBytes(encode(fromTyped(c.value)), data)) throw new Error('encode differs')
    if (!same(toTyped(decode(data, c.max_size)), c.value)) throw new Error('decode differs')
  },
  signing (c) {
    if ('valid' in c) {
      if (verifySignature(unhex(c.public_key), unhex(c.message), unhex(c.signature)) !== c.valid) throw new Error('verification differs')
      return
    }
    const seed = unhex(c.seed)
    if (peerIdFromPublicKey(publicKeyOf(seed)) !== c.peer_id) throw new Error('peer id differs')
    if (c.public_key) { if (!eqBytes(publicKeyOf(seed), unhex(c.public_key))) throw new Error('public key differs'); return }
    const body = fromTyped(c.body)
    if (!eqBytes(signingBytes(c.kind, body), unhex(c.signing_bytes))) throw new Error('signing bytes differ')
    const fields = new Map([...body].filter(([k]) => !['kind', 'v', 'publisher', 'claimant', 'signer', 'revealer'].includes(k)))
    if (!eqBytes(signMessage(seed, c.kind, fields), unhex(c.encoded))) throw new Error('signed encoding differs')
    const m = decodeMessage(unhex(c.encoded))
    if (m.kind !== c.kind || '0x' + hex(m.digest) !== c.digest || m.peerId !== c.peer_id) throw new Error('decoded message differs')
    if (!eqBytes(m.fields.get('sig'), unhex(c.signature))) throw new Error('signature differs')
  },
  claims (c) {
    const records = c.records.map(unhex)
    const valid = records.map((r) => { try { validateClaimRecord(c.key, r); return true } catch { return false } })
    if (!same(valid, c.valid)) throw new Error(`validity ${JSON.stringify(valid)}`)
    if (selectClaimRecord(c.key, records) !== c.winner) throw new Error('winner differs')
    if (selectClaimRecord(c.key, [...records].reverse()) !== (c.winner === null ? null : records.length - 1 - c.winner)) throw new Error('winner depends on order')
  },
  validation (c) { // the decode-level rules: the same code for the same bytes; every other case decodes
    const data = unhex(c.message)
    if (DECODE_CODES.has(c.reason)) return expectCode(() => decodeMessage(data, TOPIC_KINDS[c.topic]), c.reason)
    decodeMessage(data, TOPIC_KINDS[c.topic])
  }
}

for (const [suite, check] of Object.entries(checks)) {
  const result = { passed: 0, failed: [] }
  for (const file of readdirSync(join(root, suite)).filter((f) => f.endsWith('.json')).sort()) {
    try { check(JSON.parse(readFileSync(join(root, suite, file), 'utf8'))); result.passed++ } catch (err) { result.failed.push(`${file}: ${err.message}`) }
  }
  results[suite] = result
}
console.log(JSON.stringify(results))
process.exit(Object.values(results).some((r) => r.failed.length) ? 1 : 0)
