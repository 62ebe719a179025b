// A js-libp2p peer for the interop tests, driven by JSON lines on stdin; it answers and reports
// events as JSON lines on stdout. Run: node --import ./shim.mjs peer.mjs <seed hex>
//   {"id", "cmd": "dial", "addr"}                          connect to a multiaddr
//   {"id", "cmd": "subscribe", "topic"}                    then {"event": "message", ...} per message
//   {"id", "cmd": "topic_peers", "topic"}                  peers subscribed to the topic
//   {"id", "cmd": "publish", "topic", "data"}              gossip bytes (hex)
//   {"id", "cmd": "dht_put", "key", "value"}               store a record; "stored" = peers that kept it
//   {"id", "cmd": "dht_get", "key"}                        the record our selector prefers among all answers
//   {"id", "cmd": "attestation", "manifest", "step", "issued_at", "forge"}   sign one with our key;
//        forge "verdict": claims a match for a wrong post_state; "signature": a byte changed after signing
//   {"id", "cmd": "claim", "run", "step", "slot", "issued_at", "lease"}       sign a claim with our key
//   {"id", "cmd": "stop"}
import { createInterface } from 'node:readline'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { generateKeyPairFromSeed } from '@libp2p/crypto/keys'
import { gossipsub } from '@libp2p/gossipsub'
import { identify } from '@libp2p/identify'
import { kadDHT, passthroughMapper } from '@libp2p/kad-dht'
import { ping } from '@libp2p/ping'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'
import { blake2b256, decodeMessage, hex, selectClaimRecord, signMessage, unhex, validateClaimRecord } from './open1b.mjs'

const seed = unhex(process.argv[2])
const text = (b) => new TextDecoder().decode(b)
const node = await createLibp2p({
  privateKey: await generateKeyPairFromSeed('Ed25519', seed),
  addresses: { listen: ['/ip4/127.0.0.1/tcp/0'] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    identify: identify(),
    ping: ping({ maxOutboundStreams: 4 }),
    pubsub: gossipsub({ globalSignaturePolicy: 'StrictSign', allowPublishToZeroTopicPeers: true, emitSelf: false }),
    // the claim namespace validated and arbitrated exactly as docs/protocol.md says
    dht: kadDHT({
      clientMode: false,
      peerInfoMapper: passthroughMapper, // keep 127.0.0.1 addresses
      validators: { open1b: async (key, value) => { validateClaimRecord(text(key), value) } },
      selectors: { open1b: (key, records) => selectClaimRecord(text(key), records) ?? 0 }
    })
  }
})
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n')

function summary (data) { // what our decoder makes of a message, or why it refuses it
  try {
    const m = decodeMessage(data)
    const f = m.fields
    const pick = (k) => f.has(k) ? (f.get(k) instanceof Uint8Array ? hex(f.get(k)) : String(f.get(k))) : undefined
    return { kind: m.kind, signer: m.peerId, digest: hex(m.digest), run: pick('run'), step: pick('step'), verdict: pick('verdict'), pre_state: pick('pre_state'), post_state: pick('post_state'), claimant: f.has('claimant') ? m.peerId : undefined, issued_at: pick('issued_at') }
  } catch (err) {
    return { error: err.code ?? err.message }
  }
}

node.services.pubsub.addEventListener('message', (evt) => {
  const msg = evt.detail
  out({ event: 'message', topic: msg.topic, from: msg.from?.toString(), data: hex(msg.data), decoded: summary(msg.data) })
})

const commands = {
  async dial ({ addr }) { await node.dial(multiaddr(addr)); return {} },
  async subscribe ({ topic }) { node.services.pubsub.subscribe(topic); return {} },
  async topic_peers ({ topic }) { return { peers: node.services.pubsub.getSubscribers(topic).map(String) } },
  async publish ({ topic, data }) {
    const result = await node.services.pubsub.publish(topic, unhex(data))
    return { recipients: result.recipients.map(String) }
  },
  async dht_put ({ key, value, timeout_ms: ms = 10000 }) {
    const stored = []; const refused = []
    for await (const e of node.services.dht.put(new TextEncoder().encode(key), unhex(value), { signal: AbortSignal.timeout(ms) })) {
      if (e.name === 'PEER_RESPONSE' && e.record != null) stored.push(e.from.toString())
      if (e.name === 'QUERY_ERROR') refused.push(e.from.toString())
    }
    return { stored, refused }
  },
  async dht_get ({ key, timeout_ms: ms = 10000 }) {
    let value = null
    try {
      for await (const e of node.services.dht.get(new TextEncoder().encode(key), { signal: AbortSignal.timeout(ms) })) {
        if (e.name === 'VALUE') value = hex(e.value)
      }
    } catch (err) { if (err.name !== 'NotFoundError') throw err }
    return { value, decoded: value === null ? null : summary(unhex(value)) }
  },
  async attestation ({ manifest, step, issued_at: issuedAt, forge }) {
    const m = decodeMessage(unhex(manifest), ['manifest'])
    const hashes = m.fields.get('state_hashes')
    const post = forge === 'verdict' ? blake2b256(Buffer.from('not the published state')) : hashes[step + 1]
    const fields = new Map([['run', blake2b256(unhex(manifest))], ['step', BigInt(step)], ['pre_state', hashes[step]],
      ['post_state', post], ['verdict', 'match'], ['engine', m.fields.get('engine')],
      ['engine_version', m.fields.get('engine_version')], ['hardware', `js-libp2p on node ${process.version}`],
      ['device', 'cpu/js_peer'], // what it claims: it never replays (below)
      ['elapsed_ms', 0n], ['issued_at', BigInt(issuedAt)],
      // This peer never replays, so it cannot know the step's replay witness: it binds one it made
      // up, which is accepted and counted until someone reveals the real witness (run-format §5).
      ['witness', blake2b256(Buffer.from('js peer: made-up witness binding'))]])
    const data = signMessage(seed, 'attestation', fields)
    if (forge === 'signature') data[data.length - 1] ^= 1 // the last byte belongs to a signed field's value
    return { data: hex(data), decoded: summary(data) }
  },
  async claim ({ run, step, slot, issued_at: issuedAt, lease }) {
    const fields = new Map([['run', unhex(run)], ['step', BigInt(step)], ['slot', BigInt(slot)],
      ['issued_at', BigInt(issuedAt)], ['lease_expiry', BigInt(issuedAt + lease)]])
    const data = signMessage(seed, 'claim', fields)
    return { data: hex(data), decoded: summary(data) }
  },
  async stop () { setTimeout(async () => { await node.stop(); process.exit(0) }, 10); return {} }
}

out({ event: 'ready', peer_id: node.peerId.toString(), addrs: node.getMultiaddrs().map(String) })
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue
  const request = JSON.parse(line)
  try {
    out({ id: request.id, ok: true, ...(await commands[request.cmd](request)) })
  } catch (err) {
    out({ id: request.id, ok: false, error: String(err?.stack ?? err) })
  }
}
await node.stop()
