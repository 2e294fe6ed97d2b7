// kafkajs 2.2.4: create a topic, list topics, produce with keys and headers at acks=-1,
// and read everything back with kafkajs's own Fetch (its cluster/broker layer: the
// consumer API needs consumer groups, which weir serves only from a later issue).
'use strict'
const { Kafka, logLevel, CompressionTypes } = require('kafkajs')

const RECORDS = 300
const PARTITIONS = 3
const DEADLINE_MS = 60000

function fail (msg) {
  console.error(`FAIL: ${msg}`)
  process.exit(1)
}

async function consumeAll (kafka, topic, expected) {
  const sym = Object.getOwnPropertySymbols(kafka).find(s => s.toString().includes('createCluster'))
  if (!sym) fail('kafkajs internals changed: no createCluster')
  const cluster = kafka[sym]({ allowAutoTopicCreation: false })
  await cluster.connect()
  await cluster.addTargetTopic(topic)
  const leaders = cluster.findLeaderForPartitions(topic, [...Array(PARTITIONS).keys()])
  const next = new Map([...Array(PARTITIONS).keys()].map(p => [p, '0']))
  const got = []
  const end = Date.now() + DEADLINE_MS
  while (got.length < expected && Date.now() < end) {
    for (const [nodeId, partitions] of Object.entries(leaders)) {
      const broker = await cluster.findBroker({ nodeId })
      const resp = await broker.fetch({
        replicaId: -1,
        maxWaitTime: 200,
        minBytes: 1,
        topics: [{ topic, partitions: partitions.map(p => ({ partition: p, fetchOffset: next.get(p), maxBytes: 1048576 })) }]
      })
      for (const t of resp.responses) {
        for (const p of t.partitions) {
          if (p.errorCode !== 0) fail(`fetch ${topic}/${p.partition}: error ${p.errorCode}`)
          for (const m of p.messages) {
            if (BigInt(m.offset) < BigInt(next.get(p.partition))) continue
            got.push({ partition: p.partition, offset: Number(m.offset), key: m.key.toString(), value: m.value.toString(), h: m.headers.h && m.headers.h.toString() })
            next.set(p.partition, String(BigInt(m.offset) + 1n))
          }
        }
      }
    }
  }
  await cluster.disconnect()
  return got
}

function check (sent, got) {
  if (got.length !== sent.length) fail(`read ${got.length} records, sent ${sent.length}`)
  const byPart = new Map()
  for (const g of got) {
    if (g.h !== g.key) fail(`header lost at ${g.partition}/${g.offset}`)
    if (!byPart.has(g.partition)) byPart.set(g.partition, [])
    byPart.get(g.partition).push(g)
  }
  const order = new Map()
  for (const [p, rows] of byPart) {
    rows.sort((a, b) => a.offset - b.offset)
    rows.forEach((r, i) => { if (r.offset !== i) fail(`partition ${p}: offset ${r.offset} at position ${i}`) })
    for (const r of rows) {
      if (!order.has(r.key)) order.set(r.key, [])
      order.get(r.key).push(r.value)
    }
  }
  const want = new Map()
  for (const s of sent) {
    if (!want.has(s.key)) want.set(s.key, [])
    want.get(s.key).push(s.value)
  }
  for (const [k, vs] of want) {
    if (JSON.stringify(order.get(k)) !== JSON.stringify(vs)) fail(`key ${k}: content or order differs`)
  }
}

async function main () {
  const [bootstrap, topic] = process.argv.slice(2)
  const kafka = new Kafka({ clientId: 'weir-interop', brokers: [bootstrap], logLevel: logLevel.WARN, retry: { retries: 3 } })
  const admin = kafka.admin()
  await admin.connect()
  await admin.createTopics({ topics: [{ topic, numPartitions: PARTITIONS }], waitForLeaders: true, timeout: 30000 })
  const topics = await admin.listTopics()
  if (!topics.includes(topic)) fail(`${topic} not in listTopics(): ${topics}`)
  await admin.disconnect()

  const sent = [...Array(RECORDS).keys()].map(i => ({ key: `key-${i % 17}`, value: `kafkajs-value-${i}` }))
  const producer = kafka.producer({ allowAutoTopicCreation: false })
  await producer.connect()
  for (let i = 0; i < sent.length; i += 50) {
    const messages = sent.slice(i, i + 50).map(s => ({ key: s.key, value: s.value, headers: { h: s.key } }))
    await producer.send({ topic, acks: -1, compression: CompressionTypes.GZIP, messages })
  }
  await producer.disconnect()

  check(sent, await consumeAll(kafka, topic, sent.length))
}

const timer = setTimeout(() => fail('timed out after 120 s'), 120000)
main().then(() => { clearTimeout(timer); process.exit(0) }, e => fail(e.stack || e))
