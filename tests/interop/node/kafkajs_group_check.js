// kafkajs 2.2.4 group consumers: two members of one group split a 3-partition topic and
// read every record (kafkajs commits after each batch); after they disconnect, a new
// member of the group resumes at the committed offsets and reads exactly the records
// produced since.
'use strict'
const { Kafka, logLevel } = require('kafkajs')

const PARTITIONS = 3
const DEADLINE_MS = 90000

function fail (msg) {
  console.error(`FAIL: ${msg}`)
  process.exit(1)
}

async function produce (kafka, topic, first, n) {
  const producer = kafka.producer({ allowAutoTopicCreation: false })
  await producer.connect()
  const messages = [...Array(n).keys()].map(i => ({ key: `k${(first + i) % 7}`, value: `v${first + i}` }))
  await producer.send({ topic, acks: -1, messages })
  await producer.disconnect()
}

async function member (kafka, topic, group, got, assigned) {
  const c = kafka.consumer({ groupId: group, sessionTimeout: 10000, heartbeatInterval: 1000 })
  c.on(c.events.GROUP_JOIN, e => {
    const parts = (e.payload.memberAssignment[topic] || [])
    assigned.set(c, parts)
  })
  await c.connect()
  await c.subscribe({ topic, fromBeginning: true })
  await c.run({
    eachMessage: async ({ partition, message }) => {
      got.push({ partition, offset: Number(message.offset), value: message.value.toString() })
    }
  })
  return c
}

async function until (what, cond) {
  const end = Date.now() + DEADLINE_MS
  while (!cond()) {
    if (Date.now() > end) fail(`timed out waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 100))
  }
}

async function main () {
  const [bootstrap, topic] = process.argv.slice(2)
  const group = `${topic}-group`
  const kafka = new Kafka({ clientId: 'weir-interop', brokers: [bootstrap], logLevel: logLevel.WARN })
  const admin = kafka.admin()
  await admin.connect()
  await admin.createTopics({ topics: [{ topic, numPartitions: PARTITIONS }], waitForLeaders: true })
  await produce(kafka, topic, 0, 300)

  const got = []
  const assigned = new Map()
  const a = await member(kafka, topic, group, got, assigned)
  const b = await member(kafka, topic, group, got, assigned)
  const distinct = () => new Set(got.map(g => `${g.partition}/${g.offset}`)).size
  await until('an even split and all 300 records', () => {
    const pa = assigned.get(a) || []
    const pb = assigned.get(b) || []
    const union = new Set([...pa, ...pb])
    return pa.length > 0 && pb.length > 0 && union.size === PARTITIONS && distinct() >= 300
  })
  if (distinct() !== 300) fail(`read ${distinct()} distinct records of 300`)
  await a.disconnect()
  await b.disconnect()

  const offsets = await admin.fetchOffsets({ groupId: group, topics: [topic] })
  const committed = offsets[0].partitions.reduce((sum, p) => sum + Number(p.offset), 0)
  if (committed !== 300) fail(`committed offsets sum to ${committed}, not 300`)

  await produce(kafka, topic, 300, 60)
  const later = []
  const c = await member(kafka, topic, group, later, new Map())
  await until('the 60 new records', () => later.length >= 60)
  await new Promise(resolve => setTimeout(resolve, 1000))
  const values = later.map(g => Number(g.value.slice(1))).sort((x, y) => x - y)
  const want = [...Array(60).keys()].map(i => 300 + i)
  if (JSON.stringify(values) !== JSON.stringify(want)) fail(`resumed member read ${later.length} records, not exactly the 60 new ones`)
  await c.disconnect()
  const groups = await admin.listGroups()
  if (!groups.groups.some(g => g.groupId === group)) fail(`${group} missing from listGroups`)
  const described = await admin.describeGroups([group])
  if (described.groups[0].state !== 'Empty') fail(`group state ${described.groups[0].state} after all left`)
  await admin.disconnect()
  console.log(`ok: 2 members split ${PARTITIONS} partitions, ${got.length - 300} duplicates, resumed with 60 new records`)
}

const timer = setTimeout(() => fail('timed out after 150 s'), 150000)
main().then(() => { clearTimeout(timer); process.exit(0) }, e => fail(e.stack || e))
